package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/kerneldeck/kerneldeck/internal/dockertest"
	"github.com/kerneldeck/kerneldeck/internal/k8stest"
	"github.com/kerneldeck/kerneldeck/internal/sshdtest"
)

// TestMain lets the test binary be a child of the serve phase, which runs
// os.Executable() as a dashboard client: without it the child would run the
// tests again, and start dashboards of its own.
func TestMain(m *testing.M) {
	if os.Getenv(dashboardRole) != "" {
		runDashboardRole()
	}
	os.Exit(m.Run())
}

// TestQuickBench runs the bench's quick mode end to end, so a change that
// breaks a measurement fails CI. The local rows always run; the Jupyter rows
// run when /usr/bin/python3 imports jupyter_client and ipykernel (the test
// never installs packages), and the ssh rows when the test runs as root
// with /usr/sbin/sshd (with KERNELDECK_REQUIRE_SSHD=1 a missing sshd fails
// it, as in the other ssh tests).
func TestQuickBench(t *testing.T) {
	cfg := quickConfig()
	cfg.NoInstall = true
	cfg.Date = "test"
	cfg.SkipK8s = true // TestK8sQuickBench: a cluster runs in the tests' second pass
	if !hasJupyter(cfg.Python) {
		t.Logf("jupyter rows skipped: %s cannot import jupyter_client and ipykernel (apt-get install %s)", cfg.Python, strings.Join(jupyterPackages, " "))
		cfg.SkipJupyter = true
	}
	_, statErr := os.Stat(sshdtest.SSHDPath)
	switch {
	case os.Geteuid() != 0:
		t.Logf("ssh rows skipped: creating the test users needs root")
		cfg.SkipSSH = true
	case statErr != nil && os.Getenv(sshdtest.RequireEnv) == "1":
		t.Fatalf("%s missing and %s=1: apt-get install openssh-server", sshdtest.SSHDPath, sshdtest.RequireEnv)
	case statErr != nil:
		t.Logf("ssh rows skipped: %s missing (apt-get install openssh-server)", sshdtest.SSHDPath)
		cfg.SkipSSH = true
	}
	if c, err := client.New(client.FromEnv, client.WithAPIVersionNegotiation()); err != nil {
		cfg.SkipDocker = true
	} else {
		pctx, pcancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := c.Ping(pctx, client.PingOptions{NegotiateAPIVersion: true})
		pcancel()
		c.Close()
		switch {
		case err != nil && os.Getenv(dockertest.RequireEnv) == "1":
			t.Fatalf("no Docker Engine answers (%v) and %s=1", err, dockertest.RequireEnv)
		case err != nil:
			t.Logf("docker rows skipped: %v", err)
			cfg.SkipDocker = true
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var out, log bytes.Buffer
	start := time.Now()
	err := run(ctx, cfg, &out, &log)
	t.Logf("quick bench took %v", time.Since(start).Round(time.Millisecond))
	if err != nil {
		t.Fatalf("bench: %v\nlog:\n%s\ntable:\n%s", err, log.String(), out.String())
	}
	table := out.String()
	want := []string{
		"| kerneldeck, local backend | ",
		"| floor: one `bash -c true` | ",
		"| 1 backend round trip per warm cell (most in any round) | local 1.00",
		"| one dashboard `View()`, 160×50 | ",
		"| nothing changes, the editor focused (% of a core) | ",
		"| one cell streaming a line every 20 ms, its kernel selected (% of a core) | ",
	}
	if !cfg.SkipJupyter {
		want = append(want, "| local warm cell ≤ 0.5× the Jupyter kernel's (p50 ÷ p50) | 0.")
	}
	if !cfg.SkipSSH {
		want = append(want, "| kerneldeck, ssh, light shell | ", "0 failed cells in 2 rounds")
	}
	if !cfg.SkipDocker {
		want = append(want, "| kerneldeck, docker:// (a running container, /tmp on a tmpfs) | ", "| kerneldeck, docker-image:// (a container per kernel; cold start creates it) | ",
			"| docker:// warm cell within 1.5× the local backend's | ")
	}
	for _, w := range want {
		if !strings.Contains(table, w) {
			t.Errorf("table lacks %q", w)
		}
	}
	complete := []string{
		"| kerneldeck, local backend |",
		"| nothing changes, the editor focused",
		"| floor: a Python loop reading a JSON line", // its cold start too
		"| a fresh `kerneldeck headless` process to its first result",
		"| 20 new owners at once: until every one has its first result",
		"| the engine's CPU while they idle",
		"| a fresh `kerneldeck mcp` process to its first python_exec result",
		"| kerneldeck local cold start without a spare ÷ the Python exec loop's cold start",
		"| the exec loop's cold start through a spawn's bash and watcher ÷ started from Go",
		"| kerneldeck local cold start without a spare ÷ the exec loop's through a spawn's bash and watcher",
		"| the same ratio from cells run back to back, one run per subject and round (the target", // local ÷ exec loop
	}
	if !cfg.SkipSSH {
		complete = append(complete, "| the same ratio from cells run back to back, one run per subject and round (no pause") // ssh ÷ streamlocal
	}
	if !cfg.SkipDocker {
		complete = append(complete, "| through one `kerneldeck headless` process: ", "| floor: a docker-image:// kernel's container made and started",
			"| through headless: docker-image:// warm p50 ÷ local warm p50", "| through headless, a new owner's docker-image:// kernel with a pool")
	}
	for _, line := range strings.Split(table, "\n") {
		for _, c := range complete {
			if strings.HasPrefix(line, c) && strings.Contains(line, "—") {
				t.Errorf("a row with a missing figure: %s", line)
			}
		}
	}
	if t.Failed() {
		t.Logf("table:\n%s", table)
	}
}

// TestK8sQuickBench runs the latency phase of the quick bench with the
// Kubernetes rows (a single-node cluster of its own), so a change that
// breaks them fails CI: a k8s-image:// kernel's first result without a pool
// and with one, its warm cell beside local and docker-image://, the pod's
// floor and the ratios between them, every figure there.
func TestK8sQuickBench(t *testing.T) {
	cfg := quickConfig()
	cfg.NoInstall, cfg.Date, cfg.SkipSSH, cfg.SkipJupyter, cfg.Phases = true, "test", true, true, "latency"
	if os.Geteuid() != 0 && os.Getenv(k8stest.RequireEnv) != "1" {
		t.Skip("the cluster needs root")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var out, log bytes.Buffer
	err := run(ctx, cfg, &out, &log)
	if errors.Is(err, k8stest.ErrUnavailable) && os.Getenv(k8stest.RequireEnv) != "1" {
		t.Skip(err)
	}
	if err != nil {
		t.Fatalf("bench: %v\nlog:\n%s\ntable:\n%s", err, log.String(), out.String())
	}
	table := out.String()
	for _, c := range []string{
		"| floor: a k8s-image:// kernel's pod created, scheduled and started",
		"| through one `kerneldeck headless` process: k8s-image:// (a new owner's cold start creates its pod) |",
		"| through one `kerneldeck headless` process: k8s-image:// with a pool",
		"| through headless: k8s-image:// warm p50 ÷ local warm p50 |",
		"| through headless: k8s-image:// warm p50 ÷ docker-image:// warm p50 |",
		"| through headless: a new owner's k8s-image:// first result without a pool − the pod's",
	} {
		found := false
		for _, line := range strings.Split(table, "\n") {
			if strings.HasPrefix(line, c) {
				found = true
				if strings.Contains(line, "—") {
					t.Errorf("a row with a missing figure: %s", line)
				}
			}
		}
		if !found {
			t.Errorf("table lacks %q", c)
		}
	}
	if t.Failed() {
		t.Logf("table:\n%s", table)
	}
}
