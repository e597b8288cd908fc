package bench

import (
	"math"
	"math/bits"
	"time"
)

// subBits is the number of bits of precision the histogram keeps below the
// most significant bit of a value: each power-of-two range is split into
// 2^subBits equal buckets, so a bucket's width is at most 1/256 of any value it
// holds (relative error < 0.4%).
const subBits = 8

const (
	subCount = 1 << subBits
	// maxBits bounds the values recorded: 2^maxBits ns is about 4.9 hours;
	// larger values are clamped into the last bucket (and Max still reports
	// the exact largest value).
	maxBits    = 44
	numBuckets = (maxBits-subBits)*subCount + subCount
)

// Histogram counts latencies (non-negative nanosecond values) in log-linear
// buckets: values below 256 ns are counted exactly, larger values in buckets
// whose width is 1/256 of the power of two they fall in, which is the layout
// of an HDR histogram with 8 bits of sub-bucket precision. It also keeps the
// exact count, minimum, maximum and sum.
//
// A Histogram is not safe for concurrent use: each caller goroutine records
// into its own and the histograms are merged (Merge) once the run is over.
// The zero value is empty and ready to use.
type Histogram struct {
	counts   []uint64
	n        uint64
	min, max int64
	sum      float64
}

// bucketOf returns the index of the bucket that holds v (v ≥ 0).
func bucketOf(v int64) int {
	if v < subCount {
		return int(v)
	}
	p := bits.Len64(uint64(v)) - 1 // position of the most significant bit, ≥ subBits
	if p >= maxBits {
		return numBuckets - 1
	}
	shift := p - subBits
	return shift*subCount + int(v>>shift)
}

// bucketHigh returns the largest value that falls into bucket i.
func bucketHigh(i int) int64 {
	if i < 2*subCount {
		return int64(i)
	}
	shift := i/subCount - 1
	lowTop := int64(i - shift*subCount) // in [subCount, 2·subCount)
	return (lowTop+1)<<shift - 1
}

// Record adds one value, in nanoseconds; a negative value counts as 0.
func (h *Histogram) Record(ns int64) {
	if ns < 0 {
		ns = 0
	}
	if h.counts == nil {
		h.counts = make([]uint64, numBuckets)
	}
	h.counts[bucketOf(ns)]++
	if h.n == 0 || ns < h.min {
		h.min = ns
	}
	if ns > h.max {
		h.max = ns
	}
	h.n++
	h.sum += float64(ns)
}

// RecordDuration adds one duration.
func (h *Histogram) RecordDuration(d time.Duration) { h.Record(int64(d)) }

// Merge adds every value recorded in o to h. o is not changed.
func (h *Histogram) Merge(o *Histogram) {
	if o.n == 0 {
		return
	}
	if h.counts == nil {
		h.counts = make([]uint64, numBuckets)
	}
	for i, c := range o.counts {
		h.counts[i] += c
	}
	if h.n == 0 || o.min < h.min {
		h.min = o.min
	}
	if o.max > h.max {
		h.max = o.max
	}
	h.n += o.n
	h.sum += o.sum
}

// Count returns the number of values recorded.
func (h *Histogram) Count() uint64 { return h.n }

// Min returns the smallest value recorded (0 when empty).
func (h *Histogram) Min() time.Duration { return time.Duration(h.min) }

// Max returns the largest value recorded, exactly (0 when empty).
func (h *Histogram) Max() time.Duration { return time.Duration(h.max) }

// Mean returns the mean of the values recorded (0 when empty).
func (h *Histogram) Mean() time.Duration {
	if h.n == 0 {
		return 0
	}
	return time.Duration(math.Round(h.sum / float64(h.n)))
}

// Quantile returns the value at quantile q (0 < q ≤ 1) by the nearest-rank
// definition: the value v of rank ceil(q·n) in sorted order is in some bucket,
// and Quantile returns that bucket's largest value (never below v, and above it
// by less than v/256), capped at the exact maximum. An empty histogram gives 0.
func (h *Histogram) Quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q * float64(h.n)))
	if rank < 1 {
		rank = 1
	}
	if rank > h.n {
		rank = h.n
	}
	var cum uint64
	for i, c := range h.counts {
		cum += c
		if cum >= rank {
			v := bucketHigh(i)
			if v > h.max {
				v = h.max
			}
			if v < h.min {
				v = h.min
			}
			return time.Duration(v)
		}
	}
	return time.Duration(h.max)
}
