package descriptors

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// WatcherOptions configures a Watcher. Dir is required; every other field
// has a default.
type WatcherOptions struct {
	// Dir is the configuration folder (see Load).
	Dir string
	// Load tunes loading.
	Load Options
	// Interval is how often Run checks the folder for changes. Default 5s.
	Interval time.Duration
	// OnReload, when set, is called after every check with its outcome
	// (including Unchanged). Calls are serialized and made while the
	// Watcher's lock is held: OnReload must return promptly and must not
	// call Reload.
	OnReload func(ReloadEvent)
	// Now stamps events. Default time.Now.
	Now func() time.Time
	// Logger receives one line per load, failure and (at debug level)
	// unchanged check. Default: discard.
	Logger *slog.Logger
	// Tick, when set, replaces Run's ticker: Run checks once per value
	// received. Tests use it to drive Run without waiting for a timer.
	Tick <-chan time.Time
}

// Trigger says what started a check.
type Trigger uint8

const (
	// TriggerInitial is the synchronous load of NewWatcher.
	TriggerInitial Trigger = iota
	// TriggerPoll is a periodic check of Run.
	TriggerPoll
	// TriggerReload is an explicit Reload (e.g. on SIGHUP).
	TriggerReload
)

// String returns "initial", "poll" or "reload".
func (t Trigger) String() string {
	switch t {
	case TriggerInitial:
		return "initial"
	case TriggerPoll:
		return "poll"
	case TriggerReload:
		return "reload"
	}
	return "trigger(?)"
}

// Outcome is the result of a check.
type Outcome uint8

const (
	// Loaded: a new Config was compiled and is now current.
	Loaded Outcome = iota
	// Failed: the folder could not be read or the configuration is
	// invalid; the last good Config stays current.
	Failed
	// Unchanged: the files are byte-for-byte what was last checked;
	// nothing was compiled.
	Unchanged
	// Restored: the last check Failed, and the folder holds the current
	// Config's files again (a bad edit reverted, a read error gone):
	// nothing was compiled, and the failure is over.
	Restored
)

// String returns "loaded", "failed", "unchanged" or "restored".
func (o Outcome) String() string {
	switch o {
	case Restored:
		return "restored"
	case Loaded:
		return "loaded"
	case Failed:
		return "failed"
	case Unchanged:
		return "unchanged"
	}
	return "outcome(?)"
}

// ReloadEvent reports one check of the configuration folder.
type ReloadEvent struct {
	Time    time.Time
	Trigger Trigger
	Outcome Outcome
	// Err is why the check Failed (an ErrorList for an invalid
	// configuration). For Unchanged it is the error of the last load when
	// the files on disk are still the ones that failed, else nil.
	Err error
	// Config is the current Config after the check: the new one when
	// Loaded, else the last good one (nil if none ever loaded).
	Config *Config
}

// Watcher keeps the current Config of a folder and reloads it when the
// files change (polling a content hash: names and bytes of every
// configuration file, following symlinks) or when Reload is called. A new
// configuration that fails to load never replaces a good one.
//
// Current is lock-free; Reload and Run may be called concurrently from any
// goroutines. Run owns no goroutine beyond its caller's and stops with its
// context.
type Watcher struct {
	opts WatcherOptions
	cur  atomic.Pointer[Config]

	mu         sync.Mutex // serializes checks
	lastDigest string     // digest of the files last compiled ("" after a read error)
	lastErr    error      // error of that compilation
}

// NewWatcher loads opts.Dir once, synchronously. When that first load fails
// it returns the Watcher together with the error: the caller decides whether
// to give up or to keep the Watcher running (Current is nil until a load
// succeeds). The Watcher is nil only when opts are invalid.
func NewWatcher(opts WatcherOptions) (*Watcher, error) {
	if opts.Dir == "" {
		return nil, errors.New("descriptors: watcher needs a Dir")
	}
	if opts.Interval <= 0 {
		opts.Interval = 5 * time.Second
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	w := &Watcher{opts: opts}
	ev := w.check(TriggerInitial)
	if ev.Outcome == Failed {
		return w, ev.Err
	}
	return w, nil
}

// Current returns the current Config, or nil when no load has succeeded
// yet. It is lock-free.
func (w *Watcher) Current() *Config { return w.cur.Load() }

// Reload checks the folder now and returns the error of the check (nil when
// it Loaded or was Unchanged). It reloads only when the files differ from
// the current Config's, so a configuration that failed before is compiled
// again and its errors reported again. Safe concurrently with Run.
func (w *Watcher) Reload() error {
	ev := w.check(TriggerReload)
	if ev.Outcome == Failed {
		return ev.Err
	}
	return nil
}

// Run checks the folder every Interval (or on every Tick) until ctx ends,
// and returns ctx.Err().
func (w *Watcher) Run(ctx context.Context) error {
	tick := w.opts.Tick
	if tick == nil {
		t := time.NewTicker(w.opts.Interval)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick:
			w.check(TriggerPoll)
		}
	}
}

// check reads the folder, compiles it if its content changed, swaps the
// current Config on success and reports the event.
func (w *Watcher) check(trigger Trigger) ReloadEvent {
	w.mu.Lock()
	defer w.mu.Unlock()
	ev := ReloadEvent{Trigger: trigger}
	cur := w.cur.Load()
	// One read that is a ConfigMap's generation whole, or that matches a
	// generation read before, needs no confirming; any other read is
	// confirmed by reading again (settle), so that an update between two
	// files' reads never loads as a mix.
	files, whole, err := readDirOnce(w.opts.Dir)
	var sum string
	// Whether the files read are the running configuration's, or (on a
	// poll) the ones the last check read.
	running := func() bool { return cur != nil && sum == cur.Digest() }
	checked := func() bool { return trigger == TriggerPoll && sum == w.lastDigest }
	if err == nil {
		sum = digest(files)
		if !whole && !running() && !checked() {
			if files, err = settle(w.opts.Dir, files); err == nil {
				sum = digest(files)
			}
		}
	}
	if err != nil {
		// The same error as the last check's (the folder still holds no
		// configuration, or is still gone) is reported once, as a file
		// that still does not compile is: polls find it unchanged.
		stamp := "error: " + err.Error()
		if trigger == TriggerPoll && stamp == w.lastDigest {
			ev.Outcome, ev.Err = Unchanged, w.lastErr
			return w.report(ev)
		}
		w.lastDigest, w.lastErr = stamp, err
		ev.Outcome, ev.Err = Failed, err
		return w.report(ev)
	}
	switch {
	case running():
		ev.Outcome = Unchanged
		if w.lastErr != nil {
			ev.Outcome = Restored // the last check failed
		}
		w.lastDigest, w.lastErr = sum, nil
		return w.report(ev)
	case checked():
		ev.Outcome, ev.Err = Unchanged, w.lastErr
		return w.report(ev)
	}
	cfg, err := compile(files, w.opts.Load)
	w.lastDigest, w.lastErr = sum, err
	if err != nil {
		ev.Outcome, ev.Err = Failed, err
		return w.report(ev)
	}
	w.cur.Store(cfg)
	ev.Outcome = Loaded
	return w.report(ev)
}

// report stamps, logs and delivers ev; w.mu is held.
func (w *Watcher) report(ev ReloadEvent) ReloadEvent {
	ev.Time = w.opts.Now()
	ev.Config = w.cur.Load()
	log := w.opts.Logger
	switch ev.Outcome {
	case Loaded:
		log.Info("descriptor configuration loaded", "dir", w.opts.Dir, "trigger", ev.Trigger.String(),
			"domains", len(ev.Config.Domains()), "digest", ev.Config.Digest(), "warnings", len(ev.Config.Warnings()))
		for _, warn := range ev.Config.Warnings() {
			log.Warn("descriptor configuration: "+warn.Msg, "at", warn.Pos.String())
		}
	case Failed:
		if ev.Config != nil {
			log.Error("descriptor configuration rejected; keeping the last good one", "dir", w.opts.Dir,
				"trigger", ev.Trigger.String(), "err", ev.Err)
		} else {
			log.Error("descriptor configuration rejected; no configuration loaded", "dir", w.opts.Dir,
				"trigger", ev.Trigger.String(), "err", ev.Err)
		}
	case Restored:
		log.Info("descriptor configuration restored: the folder holds the running configuration again",
			"dir", w.opts.Dir, "trigger", ev.Trigger.String(), "digest", ev.Config.Digest())
	case Unchanged:
		log.Debug("descriptor configuration unchanged", "dir", w.opts.Dir, "trigger", ev.Trigger.String())
	}
	if w.opts.OnReload != nil {
		w.opts.OnReload(ev)
	}
	return ev
}
