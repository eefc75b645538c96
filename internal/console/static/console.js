// Live updates: every element with data-live is replaced, every second,
// by the HTML fragment its URL serves (rendered and escaped by the server).
"use strict";
document.querySelectorAll("[data-live]").forEach(function (el) {
  var src = el.getAttribute("data-live");
  if (!src) return;
  var every = 1000;
  function tick() {
    fetch(src, { headers: { Accept: "text/html" }, credentials: "same-origin" })
      .then(function (r) {
        if (r.status === 404) { el.classList.add("stale"); return null; }
        if (!r.ok) throw new Error(r.status);
        return r.text();
      })
      .then(function (html) {
        if (html !== null) { el.innerHTML = html; el.classList.remove("stale"); }
        setTimeout(tick, every);
      })
      .catch(function () { el.classList.add("stale"); setTimeout(tick, every * 3); });
  }
  setTimeout(tick, every);
});
