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
        if (r.status === 401) { // the session ended (the console restarted): log in again
          location.assign("/login?next=" + encodeURIComponent(location.pathname + location.search));
          return new Promise(function () {});
        }
        if (!r.ok) throw new Error(r.status);
        return r.text();
      })
      .then(function (html) {
        if (html !== null) {
          // A long value opened with "show all" stays open.
          var open = Array.prototype.map.call(el.querySelectorAll("details[open][id]"), function (d) { return d.id; });
          el.innerHTML = html;
          el.classList.remove("stale");
          open.forEach(function (id) { var d = document.getElementById(id); if (d) d.open = true; });
        }
        setTimeout(tick, every);
      })
      .catch(function () { el.classList.add("stale"); setTimeout(tick, every * 3); });
  }
  setTimeout(tick, every);
});
