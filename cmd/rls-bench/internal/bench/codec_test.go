package bench

import (
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
)

// richResponse is a response with code and every kind of field a server
// may send: statuses with limits and durations, headers, a body and
// dynamic metadata.
func richResponse(code rlsv3.RateLimitResponse_Code) *rlsv3.RateLimitResponse {
	md, err := structpb.NewStruct(map[string]any{"policy": "bench", "remaining": 3, "near": false})
	if err != nil {
		panic(err) // constant input
	}
	return &rlsv3.RateLimitResponse{
		OverallCode: code,
		Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{
			Code:               code,
			CurrentLimit:       &rlsv3.RateLimitResponse_RateLimit{Name: "ip", RequestsPerUnit: 10, Unit: rlsv3.RateLimitResponse_RateLimit_MINUTE},
			LimitRemaining:     3,
			DurationUntilReset: durationpb.New(1500000000),
		}},
		ResponseHeadersToAdd: []*corev3.HeaderValue{{Key: "RateLimit", Value: `"ip";r=3;t=2`}},
		RequestHeadersToAdd:  []*corev3.HeaderValue{{Key: "x-rl", Value: "1"}},
		RawBody:              []byte("slow down"),
		DynamicMetadata:      md,
		Quota:                &rlsv3.RateLimitResponse_Quota{Requests: 7},
	}
}

func TestOverallCodeReadsTheCodeAlone(t *testing.T) {
	cases := []struct {
		name string
		resp *rlsv3.RateLimitResponse
	}{
		{"ok with everything", richResponse(rlsv3.RateLimitResponse_OK)},
		{"over limit with everything", richResponse(rlsv3.RateLimitResponse_OVER_LIMIT)},
		{"over limit alone", &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT}},
		{"no code", &rlsv3.RateLimitResponse{RawBody: []byte("x")}},
		{"empty", &rlsv3.RateLimitResponse{}},
	}
	for _, c := range cases {
		b, err := proto.Marshal(c.resp)
		if err != nil {
			t.Fatal(err)
		}
		r := overallCode{code: rlsv3.RateLimitResponse_OVER_LIMIT} // parse must reset it
		if err := r.parse(b); err != nil {
			t.Errorf("%s: %v", c.name, err)
		}
		if r.code != c.resp.GetOverallCode() {
			t.Errorf("%s: code %v, want %v", c.name, r.code, c.resp.GetOverallCode())
		}
	}
}

func TestOverallCodeLastWins(t *testing.T) {
	// Two serializations concatenated are their merge: the later code wins.
	a, _ := proto.Marshal(&rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK})
	b, _ := proto.Marshal(richResponse(rlsv3.RateLimitResponse_OVER_LIMIT))
	var r overallCode
	if err := r.parse(append(a, b...)); err != nil || r.code != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("code %v, err %v; want OVER_LIMIT", r.code, err)
	}
}

func TestOverallCodeRejectsMalformed(t *testing.T) {
	full, err := proto.Marshal(richResponse(rlsv3.RateLimitResponse_OK))
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range [][]byte{
		full[:len(full)-1], // a field cut short
		{0x08},             // overall_code's tag without its value
		{0x80},             // a truncated tag
		{0x0f, 0x01},       // wire type 7 does not exist
	} {
		var r overallCode
		if err := r.parse(b); err == nil {
			t.Errorf("% x: no error", b)
		}
	}
}
