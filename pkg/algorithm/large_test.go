package algorithm

import (
	"math/big"
	"testing"
)

// TestSlidingWindowWeightExact: the previous bucket's weight is
// ceil(prev·(W−e)/W) exactly where prev·W passes 2^53 (float64 would round
// the product: at 4,999,003 hits and e = 110,444,333 ms of a 30-day window it
// gave 4,785,997 for 4,785,998) and 2^64 (3 billion a year: uint64 would
// wrap), against math/big.
func TestSlidingWindowWeightExact(t *testing.T) {
	const month, year = 30 * 86_400_000, 365 * 86_400_000
	for _, c := range []struct {
		w, e int64
		prev uint64
	}{
		{month, 110_444_333, 4_999_003},
		{month, 1, 4_999_003},
		{month, month - 1, 5_000_000},
		{year, 12_345_678_901, 3_000_000_000},
		{year, year - 1, 2_999_999_999},
		{1000, 0, 5},
		{1000, 999, 5},
	} {
		a := SlidingWindow{Limit: c.prev, Window: c.w}
		num := new(big.Int).Mul(new(big.Int).SetUint64(c.prev), big.NewInt(c.w-c.e))
		den := big.NewInt(c.w)
		q, m := new(big.Int).QuoRem(num, den, new(big.Int))
		if m.Sign() > 0 {
			q.Add(q, big.NewInt(1))
		}
		if got := a.weight(c.prev, c.e); got != q.Uint64() {
			t.Errorf("weight(%d, e=%d) of W=%d = %d, want %d", c.prev, c.e, c.w, got, q.Uint64())
		}
	}
}
