// Package deploytest checks the deployment files against the commands
// they run, so that docker-compose.yml stays in step with the flags.
package deploytest

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"go.yaml.in/yaml/v3"
)

type compose struct {
	Services map[string]struct {
		Entrypoint []string          `yaml:"entrypoint"`
		Command    []string          `yaml:"command"`
		Env        map[string]string `yaml:"environment"`
	} `yaml:"services"`
}

// Every batchmr service's command line parses: the binary accepts its
// flags (a flag that does not exist exits 2 before --help is reached).
func TestComposeCommandsUseFlagsTheCommandsHave(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("../../../docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	var c compose
	if err := yaml.Unmarshal(raw, &c); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	bins := map[string]string{
		"/usr/local/bin/worker":     "../../../cmd/worker",
		"/usr/local/bin/scheduler":  "../../../cmd/scheduler",
		"/usr/local/bin/pagination": "../../../examples/pagination",
	}
	for path, pkg := range bins {
		out := filepath.Join(dir, filepath.Base(path))
		if b, err := exec.Command("go", "build", "-o", out, pkg).CombinedOutput(); err != nil {
			t.Fatalf("building %s: %v\n%s", pkg, err, b)
		}
		bins[path] = out
	}
	checked := 0
	for name, svc := range c.Services {
		if svc.Command == nil || (name != "worker" && svc.Entrypoint == nil) {
			continue // redis, postgres
		}
		entry := "/usr/local/bin/worker" // the image's ENTRYPOINT
		if len(svc.Entrypoint) > 0 {
			entry = svc.Entrypoint[0]
		}
		bin, ok := bins[entry]
		if !ok {
			t.Errorf("service %s runs %s, which the Dockerfile does not build", name, entry)
			continue
		}
		args := append(append([]string{}, svc.Command...), "--help")
		if out, err := exec.Command(bin, args...).CombinedOutput(); err != nil {
			t.Errorf("service %s: %s %v: %v\n%s", name, entry, svc.Command, err, out)
		}
		checked++
	}
	if checked != 3 {
		t.Errorf("checked %d batchmr services, want worker, scheduler and seed", checked)
	}
}
