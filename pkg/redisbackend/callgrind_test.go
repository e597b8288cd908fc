package redisbackend

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/envoy-rls/envoy-rls/internal/testenv"
)

// TestCallgrindCheckScript runs scripts/callgrind-check.sh (the instruction
// counts in the README and docs/performance.md come from it) for both mixes
// of check.lua and for the incumbent's plain commands (plain3desc) at once,
// with 1 and with 4 Checks per call. Its counts are exact, so the test can
// hold them to what coalescing promises: a Check costs Redis fewer
// instructions in a call of 4 than alone, in either mix (the call, its MGET
// and TIME, and three descriptors' shared route counter are paid once per
// call; a lone Check takes check.lua's lone-group path and a call of 4 the
// string counters' path, so this holds each path's bookkeeping to less than
// coalescing saves); and a Check of four limits costs more than one of
// three.
func TestCallgrindCheckScript(t *testing.T) {
	for _, tool := range []string{"valgrind", "callgrind_control", "callgrind_annotate"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s not found: run scripts/install-deps.sh (Debian's valgrind package)", tool)
		}
	}
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	line := regexp.MustCompile(`(\w+), (\d+) Checks per call, (\d+) Checks measured: (\d+) instructions per Check, (\d+) inside FCALL`)
	// measure runs the script once and returns its count per Check, or
	// 0 after reporting why not.
	measure := func(mix string, perCall int) int {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		cmd := exec.CommandContext(ctx, "bash", filepath.Join(root, "scripts", "callgrind-check.sh"), strconv.Itoa(perCall), mix)
		// CALLGRIND_OUT keeps the measured pass's dump for
		// callgrind_annotate: it must hold the same counts.
		dump := filepath.Join(t.TempDir(), "callgrind.out")
		cmd.Env = append(os.Environ(), "CALLGRIND_OUT="+dump)
		out, err := cmd.CombinedOutput()
		cancel()
		if err != nil {
			t.Errorf("callgrind-check.sh %d %s: %v\n%s", perCall, mix, err, out)
			return 0
		}
		m := line.FindStringSubmatch(string(out))
		if m == nil {
			t.Errorf("callgrind-check.sh %d %s printed no count:\n%s", perCall, mix, out)
			return 0
		}
		n := make([]int, len(m))
		for i := 2; i < len(m); i++ {
			n[i], _ = strconv.Atoi(m[i])
		}
		if m[1] != mix || n[2] != perCall || n[3] != 200*perCall {
			t.Errorf("callgrind-check.sh %d %s: mix %s, %d Checks per call and %d measured, want %s, %d and %d", perCall, mix, m[1], n[2], n[3], mix, perCall, 200*perCall)
		}
		switch {
		case mix == plainMix && (n[4] <= 0 || n[5] != 0):
			t.Errorf("callgrind-check.sh %d %s: %d instructions per request, %d inside FCALL: want some, none in FCALL", perCall, mix, n[4], n[5])
		case mix != plainMix && (n[5] <= 0 || n[5] >= n[4]):
			t.Errorf("callgrind-check.sh %d %s: %d instructions per Check, %d inside FCALL: want 0 < FCALL < all", perCall, mix, n[4], n[5])
		}
		if kept, err := os.ReadFile(dump); err != nil || !bytes.Contains(kept, []byte("\nevents: Ir\n")) {
			t.Errorf("callgrind-check.sh %d %s: CALLGRIND_OUT=%s holds no callgrind dump (%v)", perCall, mix, dump, err)
		}
		t.Logf("%s, %d Checks per call: %d instructions per Check (%d inside FCALL)", mix, perCall, n[4], n[5])
		return n[4]
	}
	// The mixes run at once, each on its own redis-server under
	// callgrind: a run must count its own server only (as two make test
	// runs on one machine would need).
	mixes := []string{"3desc", "4limits", plainMix}
	perCheck := map[string]map[int]int{"3desc": {}, "4limits": {}, plainMix: {}}
	for _, perCall := range []int{1, 4} {
		counts := make([]int, len(mixes))
		var wg sync.WaitGroup
		for i, mix := range mixes {
			wg.Go(func() { counts[i] = measure(mix, perCall) })
		}
		wg.Wait()
		if t.Failed() {
			t.FailNow()
		}
		for i, mix := range mixes {
			perCheck[mix][perCall] = counts[i]
		}
	}
	for _, mix := range []string{"3desc", "4limits"} {
		if perCheck[mix][4] >= perCheck[mix][1] {
			t.Errorf("%s: a Check costs %d instructions in a call of 4 and %d alone: coalescing saves Redis nothing", mix, perCheck[mix][4], perCheck[mix][1])
		}
	}
	for _, perCall := range []int{1, 4} {
		if perCheck["4limits"][perCall] <= perCheck["3desc"][perCall] {
			t.Errorf("%d Checks per call: four limits cost %d instructions per Check, three %d: want more for four", perCall, perCheck["4limits"][perCall], perCheck["3desc"][perCall])
		}
	}
}
