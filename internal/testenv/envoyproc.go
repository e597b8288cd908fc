package testenv

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// envoyReadyTimeout bounds how long Envoy may take until its admin /ready
// endpoint says LIVE.
const envoyReadyTimeout = 60 * time.Second

// Envoy is a running envoy process started by StartEnvoy. Its methods are
// safe for concurrent use; Stop must run on the test goroutine.
type Envoy struct {
	// AdminAddr is the admin listener's "host:port" as Envoy reported it
	// (so the bootstrap may ask for port 0).
	AdminAddr string
	// ConfigPath is the bootstrap file Envoy was started with.
	ConfigPath string

	t       testing.TB
	logPath string

	mu   sync.Mutex
	proc *process
}

// StartEnvoy writes bootstrapYAML to a temporary file, starts EnvoyBinary
// with it (--concurrency 1, hot restart disabled) and waits until the admin
// endpoint /ready answers 200 (listeners bound, clusters initialised). The
// bootstrap must configure an admin listener (address 127.0.0.1, port 0 is
// fine); everything else, including listener ports (see FreePort), is up to
// the caller. Envoy is killed when the test ends and its log is printed if
// the test failed.
func StartEnvoy(t testing.TB, bootstrapYAML string) *Envoy {
	t.Helper()
	bin := EnvoyBinary(t)
	dir := t.TempDir()
	e := &Envoy{
		t:          t,
		ConfigPath: filepath.Join(dir, "envoy.yaml"),
		logPath:    filepath.Join(dir, "envoy.log"),
	}
	t.Cleanup(e.cleanup)
	if err := os.WriteFile(e.ConfigPath, []byte(bootstrapYAML), 0o644); err != nil {
		t.Fatalf("testenv: write envoy bootstrap: %v", err)
	}
	adminPath := filepath.Join(dir, "admin-address")
	p, err := startProcess(bin, []string{
		"-c", e.ConfigPath,
		"--concurrency", "1",
		"--disable-hot-restart",
		"--admin-address-path", adminPath,
		"--log-level", "info",
	}, dir, e.logPath)
	if err != nil {
		t.Fatalf("testenv: start envoy: %v", err)
	}
	e.mu.Lock()
	e.proc = p
	e.mu.Unlock()

	ctx, cancel := context.WithTimeout(context.Background(), envoyReadyTimeout)
	defer cancel()
	err = pollUntil(ctx, p.done, func() error {
		b, err := os.ReadFile(adminPath)
		if err != nil || strings.TrimSpace(string(b)) == "" {
			return fmt.Errorf("no admin address yet in %s", adminPath)
		}
		e.AdminAddr = strings.TrimSpace(string(b))
		return envoyReady(ctx, e.AdminAddr)
	})
	if err != nil {
		t.Fatalf("testenv: envoy not ready: %v\n%s", err, readTail(e.logPath))
	}
	return e
}

func envoyReady(ctx context.Context, adminAddr string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+adminAddr+"/ready", nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<10))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("/ready: %s %s", resp.Status, strings.TrimSpace(string(body)))
	}
	return nil
}

// Stop sends SIGTERM, waits for the exit (SIGKILL after a deadline).
// Stop on a stopped Envoy does nothing.
func (e *Envoy) Stop() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.proc == nil {
		return
	}
	_ = e.proc.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-e.proc.done:
	case <-time.After(stopTimeout):
		e.proc.kill()
	}
	e.proc = nil
}

// Log returns the end of Envoy's log.
func (e *Envoy) Log() string { return readTail(e.logPath) }

func (e *Envoy) cleanup() {
	e.mu.Lock()
	if e.proc != nil {
		e.proc.kill()
		e.proc = nil
	}
	e.mu.Unlock()
	if e.t.Failed() {
		e.t.Logf("testenv: envoy log (%s):\n%s", e.logPath, readTail(e.logPath))
	}
}

// pollUntil calls f until it returns nil, the process exits (done closed) or
// ctx ends.
func pollUntil(ctx context.Context, done <-chan struct{}, f func() error) error {
	for {
		err := f()
		if err == nil {
			return nil
		}
		select {
		case <-done:
			return fmt.Errorf("process exited (last: %v)", err)
		case <-ctx.Done():
			return fmt.Errorf("%w; last: %v", ctx.Err(), err)
		case <-time.After(pollInterval * 5):
		}
	}
}
