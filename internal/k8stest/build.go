// Package k8stest runs a real single-node Kubernetes cluster on this
// machine for tests: etcd, kube-apiserver, kube-scheduler, a private containerd and a
// kubelet, with every address the cluster uses on this machine. The
// cluster's own binaries are built once from the Go module proxy and kept
// in a cache dir; Debian's packages give the rest.
package k8stest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"time"
)

// Version is the Kubernetes release the test cluster runs.
const Version = "v1.35.4"

// stagingVersion is the version of the k8s.io/* staging modules that
// release was cut with.
const stagingVersion = "v0.35.4"

// binaries are what is built; the rest comes from Debian's packages.
var binaries = []string{"kube-apiserver", "kube-scheduler", "kubelet"}

// BinDirEnv names a dir holding the built binaries, instead of the cache.
const BinDirEnv = "KERNELDECK_K8S_BIN"

// BinDir is where the built binaries are kept: $KERNELDECK_K8S_BIN, else
// the user's cache dir, by version.
func BinDir() string {
	if d := os.Getenv(BinDirEnv); d != "" {
		return d
	}
	dir, err := os.UserCacheDir()
	if err != nil {
		dir = os.TempDir()
	}
	return filepath.Join(dir, "kerneldeck", "k8s", Version)
}

// built reports whether dir holds every binary, each saying it is Version.
func built(dir string) bool {
	for _, b := range binaries {
		out, err := exec.Command(filepath.Join(dir, b), "--version").Output()
		if err != nil || !strings.Contains(string(out), Version) {
			return false
		}
	}
	return true
}

// Build builds kube-apiserver, kube-scheduler and kubelet of Version into BinDir, unless
// they are there already, and returns the dir. It takes some 20 CPU
// minutes the first time (a module of its own that requires
// k8s.io/kubernetes, its staging modules replaced by their released
// versions), with CGO off and the checksum database off (not reachable
// here).
func Build(ctx context.Context, log io.Writer) (string, error) {
	dir := BinDir()
	if built(dir) {
		return dir, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("k8stest: %w", err)
	}
	work, err := os.MkdirTemp("", "kerneldeck-k8s-build-")
	if err != nil {
		return "", fmt.Errorf("k8stest: %w", err)
	}
	defer os.RemoveAll(work)
	env := append(os.Environ(), "GOSUMDB=off", "GOFLAGS=-mod=mod", "CGO_ENABLED=0")
	run := func(args ...string) ([]byte, error) {
		cmd := exec.CommandContext(ctx, "go", args...)
		cmd.Dir, cmd.Env = work, env
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			return out, fmt.Errorf("go %s: %w: %s", strings.Join(args, " "), err, tail(stderr.String(), 2000))
		}
		return out, nil
	}
	start := time.Now()
	fmt.Fprintf(log, "k8stest: building kube-apiserver, kube-scheduler and kubelet %s into %s (once; some minutes)\n", Version, dir)
	if err := os.WriteFile(filepath.Join(work, "go.mod"), []byte("module kerneldeck.local/k8sbuild\n\ngo 1.26\n"), 0o644); err != nil {
		return "", err
	}
	out, err := run("mod", "download", "-json", "k8s.io/kubernetes@"+Version)
	if err != nil {
		return "", err
	}
	var info struct{ GoMod string }
	if err := json.Unmarshal(out, &info); err != nil || info.GoMod == "" {
		return "", fmt.Errorf("k8stest: go mod download k8s.io/kubernetes@%s: %q", Version, tail(string(out), 500))
	}
	staging, err := stagingModules(info.GoMod)
	if err != nil {
		return "", err
	}
	var mod strings.Builder
	fmt.Fprintf(&mod, "module kerneldeck.local/k8sbuild\n\ngo 1.26\n\nrequire k8s.io/kubernetes %s\n\nreplace (\n", Version)
	for _, m := range staging {
		fmt.Fprintf(&mod, "\t%s => %s %s\n", m, m, stagingVersion)
	}
	mod.WriteString(")\n")
	if err := os.WriteFile(filepath.Join(work, "go.mod"), []byte(mod.String()), 0o644); err != nil {
		return "", err
	}
	minor := strings.Split(strings.TrimPrefix(Version, "v"), ".")[1]
	ldflags := fmt.Sprintf("-s -w -X k8s.io/component-base/version.gitVersion=%s -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=%s -X k8s.io/component-base/version.gitTreeState=clean", Version, minor)
	args := []string{"build", "-trimpath", "-ldflags", ldflags, "-o", dir + "/"}
	for _, b := range binaries {
		args = append(args, "k8s.io/kubernetes/cmd/"+b)
	}
	if _, err := run(args...); err != nil {
		return "", err
	}
	if !built(dir) {
		return "", fmt.Errorf("k8stest: the binaries built into %s do not say they are %s", dir, Version)
	}
	fmt.Fprintf(log, "k8stest: built in %v\n", time.Since(start).Round(time.Second))
	return dir, nil
}

// stagingModules lists the modules k8s.io/kubernetes's go.mod replaces
// with its staging dirs.
func stagingModules(gomod string) ([]string, error) {
	f, err := os.Open(gomod)
	if err != nil {
		return nil, fmt.Errorf("k8stest: %w", err)
	}
	defer f.Close()
	re := regexp.MustCompile(`^\s*(k8s\.io/[a-z0-9.-]+)\s+=>\s+\./staging/`)
	var mods []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if m := re.FindStringSubmatch(sc.Text()); m != nil {
			mods = append(mods, m[1])
		}
	}
	if len(mods) == 0 {
		return nil, fmt.Errorf("k8stest: %s replaces no staging module", gomod)
	}
	return mods, sc.Err()
}

func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}
