package descriptors

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/envoy-rls/envoy-rls/internal/testenv"
)

// pollTicks runs w with a tick channel, sends n ticks and waits for each
// to be checked.
func pollTicks(t *testing.T, w *Watcher, checked <-chan ReloadEvent, n int) {
	t.Helper()
	tick := make(chan time.Time)
	w.opts.Tick = tick
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	for range n {
		tick <- time.Now()
		<-checked
	}
	cancel()
	<-done
}

// TestBrokenFolderReportedOncePerChange: a configuration that does not
// load on a poll is logged at error level and counted as a failed reload
// once, however many polls find it unchanged: a file that does not compile
// was, but a folder whose YAML files were all removed, or the folder itself
// removed, was logged and counted at every poll (a review's finding: 720
// lines an hour at the default interval).
func TestBrokenFolderReportedOncePerChange(t *testing.T) {
	for _, tc := range []struct {
		name  string
		spoil func(dir string) error
	}{
		{"bad yaml", func(dir string) error {
			return os.WriteFile(filepath.Join(dir, "a.yaml"), []byte("domain: edge\ndescriptors: [\n"), 0o644)
		}},
		{"yaml files removed", func(dir string) error {
			return os.Remove(filepath.Join(dir, "a.yaml"))
		}},
		{"folder removed", func(dir string) error {
			return os.RemoveAll(dir)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "cfg")
			if err := os.Mkdir(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "a.yaml"), []byte(fmt.Sprintf(ruleYAML, "k")), 0o644); err != nil {
				t.Fatal(err)
			}
			var buf testenv.Buffer
			checked := make(chan ReloadEvent, 100)
			failures := 0
			w, err := NewWatcher(WatcherOptions{
				Dir:    dir,
				Logger: slog.New(slog.NewTextHandler(&buf, nil)),
				OnReload: func(ev ReloadEvent) {
					if ev.Trigger == TriggerPoll {
						if ev.Outcome == Failed {
							failures++
						}
						checked <- ev
					}
				},
			})
			if err != nil {
				t.Fatal(err)
			}
			if err := tc.spoil(dir); err != nil {
				t.Fatal(err)
			}
			pollTicks(t, w, checked, 20)
			errs := strings.Count(buf.String(), "level=ERROR")
			if errs != 1 || failures != 1 {
				t.Errorf("20 polls of one unchanged broken configuration: %d ERROR lines, %d failed reloads counted; want 1 and 1\n%s",
					errs, failures, firstLines(buf.String(), 3))
			}
			if w.Current() == nil {
				t.Errorf("last good configuration dropped")
			}
		})
	}
}

func firstLines(s string, n int) string {
	ls := strings.SplitN(s, "\n", n+1)
	if len(ls) > n {
		ls = ls[:n]
	}
	return strings.Join(ls, "\n")
}
