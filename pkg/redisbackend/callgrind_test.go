package redisbackend

import (
	"context"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/envoy-rls/envoy-rls/internal/testenv"
)

// TestCallgrindCheckScript runs scripts/callgrind-check.sh (the README's
// instruction counts come from it) with 1 and with 4 Checks per call. Its
// counts are exact, so the test can hold them to what coalescing promises:
// a Check costs Redis fewer instructions in a call of 4 than alone (the
// call, the MGET and the shared route counter are paid once per call).
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
	line := regexp.MustCompile(`(\d+) Checks per call, (\d+) Checks measured: (\d+) instructions per Check, (\d+) inside FCALL`)
	perCheck := map[int]int{}
	for _, perCall := range []int{1, 4} {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		out, err := exec.CommandContext(ctx, "bash", filepath.Join(root, "scripts", "callgrind-check.sh"), strconv.Itoa(perCall)).CombinedOutput()
		cancel()
		if err != nil {
			t.Fatalf("callgrind-check.sh %d: %v\n%s", perCall, err, out)
		}
		m := line.FindStringSubmatch(string(out))
		if m == nil {
			t.Fatalf("callgrind-check.sh %d printed no count:\n%s", perCall, out)
		}
		n := make([]int, len(m))
		for i := 1; i < len(m); i++ {
			n[i], _ = strconv.Atoi(m[i])
		}
		if n[1] != perCall || n[2] != 200*perCall {
			t.Errorf("callgrind-check.sh %d: %d Checks per call and %d measured, want %d and %d", perCall, n[1], n[2], perCall, 200*perCall)
		}
		if n[4] <= 0 || n[4] >= n[3] {
			t.Errorf("callgrind-check.sh %d: %d instructions per Check, %d inside FCALL: want 0 < FCALL < all", perCall, n[3], n[4])
		}
		perCheck[perCall] = n[3]
		t.Logf("%d Checks per call: %d instructions per Check (%d inside FCALL)", perCall, n[3], n[4])
	}
	if perCheck[4] >= perCheck[1] {
		t.Errorf("a Check costs %d instructions in a call of 4 and %d alone: coalescing saves Redis nothing", perCheck[4], perCheck[1])
	}
}
