package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/envoy-rls/envoy-rls/internal/testenv"
)

// binDir holds the envoy-rls binary built for this test run; TestMain owns it
// and removes it at the end.
var binDir string

// envoyRLSBuild builds ./cmd/envoy-rls at most once per test run, on first use.
var envoyRLSBuild struct {
	once sync.Once
	path string
	err  error
}

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "envoy-rls-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		os.Exit(1)
	}
	binDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// repoRoot returns the repository root (the directory holding go.mod).
func repoRoot(t testing.TB) string {
	t.Helper()
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// envoyRLSBinary returns the path of envoy-rls built from ./cmd/envoy-rls,
// building it on first use; $ENVOY_RLS_BIN, when set, names a prebuilt binary
// to test instead. A failed build fails every test that needs it.
func envoyRLSBinary(t testing.TB) string {
	t.Helper()
	root := repoRoot(t)
	envoyRLSBuild.once.Do(func() {
		if bin := os.Getenv("ENVOY_RLS_BIN"); bin != "" {
			envoyRLSBuild.path, envoyRLSBuild.err = bin, nil
			if _, err := os.Stat(bin); err != nil {
				envoyRLSBuild.err = fmt.Errorf("ENVOY_RLS_BIN: %w", err)
			}
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		out := filepath.Join(binDir, "envoy-rls")
		cmd := exec.CommandContext(ctx, "go", "build", "-tags", "vtprotobuf", "-o", out, "./cmd/envoy-rls")
		cmd.Dir = root
		if b, err := cmd.CombinedOutput(); err != nil {
			envoyRLSBuild.err = fmt.Errorf("go build -tags vtprotobuf ./cmd/envoy-rls: %w\n%s", err, b)
			return
		}
		envoyRLSBuild.path = out
	})
	if envoyRLSBuild.err != nil {
		t.Fatal(envoyRLSBuild.err)
	}
	return envoyRLSBuild.path
}

// rlsFlag is one flag of `envoy-rls serve`, as its help prints it.
type rlsFlag struct {
	Name    string // "grpc.addr"
	Default string // ":8081"
	Env     string // "ENVOY_RLS_GRPC_ADDR"
}

var (
	flagLineRE = regexp.MustCompile(`^\s+-{1,2}([A-Za-z0-9][A-Za-z0-9._-]*)(?:\s+\(default "([^"]*)"\))?`)
	envRE      = regexp.MustCompile(`\[\$(ENVOY_RLS_[A-Z0-9_]+)\]`)
)

// envoyRLSFlags runs `envoy-rls serve -h` and returns its flags by name.
func envoyRLSFlags(t testing.TB) map[string]rlsFlag {
	t.Helper()
	bin := envoyRLSBinary(t)
	cmd := exec.Command(bin, "serve", "-h")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	_ = cmd.Run() // -h exits non-zero with some flag packages; the text is what counts
	flags := parseFlagHelp(out.String())
	if len(flags) == 0 {
		t.Fatalf("no flags found in the output of `envoy-rls serve -h`:\n%s", out.String())
	}
	return flags
}

// parseFlagHelp reads flag names, defaults and environment variables from the
// help text of envoy-rls (`  --name (default "x")` then `usage  [$ENV]`).
func parseFlagHelp(help string) map[string]rlsFlag {
	flags := map[string]rlsFlag{}
	var cur string
	for _, line := range strings.Split(help, "\n") {
		if m := flagLineRE.FindStringSubmatch(line); m != nil {
			cur = m[1]
			flags[cur] = rlsFlag{Name: cur, Default: m[2], Env: envNameOf(cur)}
			continue
		}
		if m := envRE.FindStringSubmatch(line); m != nil && cur != "" {
			f := flags[cur]
			f.Env = m[1]
			flags[cur] = f
		}
	}
	return flags
}

// envNameOf is the documented env fallback of a flag: ENVOY_RLS_ and the name
// upper-cased with '.' and '-' as '_'.
func envNameOf(flag string) string {
	return "ENVOY_RLS_" + strings.NewReplacer(".", "_", "-", "_").Replace(strings.ToUpper(flag))
}
