package rls

import (
	"bytes"
	"context"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// TestCodecHasVTProto fails a build without the vtprotobuf tag, whose Codec
// encodes responses as slowly as gRPC's own: make, the Dockerfile and make
// bench build with it, and so must a test run.
func TestCodecHasVTProto(t *testing.T) {
	if !VTProto() {
		t.Fatal("built without go-control-plane's vtprotobuf encoders: " +
			"run the tests with `make test`, or `go test -tags vtprotobuf`")
	}
}

func newCodec(t *testing.T) *Codec {
	t.Helper()
	c, err := NewCodec()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// everyField is a response with every field of RateLimitResponse and of the
// messages in it set, unknown fields included.
func everyField() *rlsv3.RateLimitResponse {
	st := &rlsv3.RateLimitResponse_DescriptorStatus{
		Code: rlsv3.RateLimitResponse_OVER_LIMIT,
		CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{
			Name: "límite", RequestsPerUnit: 10, Unit: rlsv3.RateLimitResponse_RateLimit_MINUTE,
			UnitMultiplier: wrapperspb.UInt32(5),
		},
		LimitRemaining:     3,
		DurationUntilReset: durationpb.New(1500 * time.Millisecond),
		Quota: &rlsv3.RateLimitResponse_Quota{
			Requests:            7,
			Id:                  "q",
			ExpirationSpecifier: &rlsv3.RateLimitResponse_Quota_ValidUntil{ValidUntil: timestamppb.New(time.Unix(1700000000, 5))},
		},
	}
	st.CurrentLimit.ProtoReflect().SetUnknown(protoBytes(99, "nested unknown"))
	resp := &rlsv3.RateLimitResponse{
		OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT,
		Statuses:    []*rlsv3.RateLimitResponse_DescriptorStatus{st, {Code: rlsv3.RateLimitResponse_OK}},
		ResponseHeadersToAdd: []*corev3.HeaderValue{
			{Key: "retry-after", Value: "60"},
			{Key: "x-raw", RawValue: []byte{0xff, 0}},
		},
		RequestHeadersToAdd: []*corev3.HeaderValue{{Key: "x-limited", Value: "yes"}},
		RawBody:             []byte(`{"title":"Too Many Requests"}`),
		DynamicMetadata: &structpb.Struct{Fields: map[string]*structpb.Value{
			"only": structpb.NewListValue(&structpb.ListValue{Values: []*structpb.Value{
				structpb.NewNumberValue(1.5), structpb.NewBoolValue(true), structpb.NewStringValue("s"),
			}}),
		}},
		Quota: &rlsv3.RateLimitResponse_Quota{Requests: 1},
	}
	resp.ProtoReflect().SetUnknown(protoBytes(100, "unknown"))
	return resp
}

// protoBytes is one length-delimited field, as unknown fields.
func protoBytes(num int, s string) []byte {
	b := []byte{byte(num<<3 | 2)}
	if num >= 16 {
		b = []byte{byte(num<<3|2) | 0x80, byte(num >> 4)}
	}
	return append(append(b, byte(len(s))), s...)
}

// codecResponses are the responses TestCodecWritesWhatProtoWrites encodes:
// every respond case of the metadata tests, the service's answers to
// requests over and under their limits, an unknown domain's, everyField,
// and one longer than outPool's buffers.
func codecResponses(t *testing.T) map[string]*rlsv3.RateLimitResponse {
	t.Helper()
	out := map[string]*rlsv3.RateLimitResponse{
		"every_field": everyField(),
		// Longer than outPool's own buffers.
		"long_body": {OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT, RawBody: bytes.Repeat([]byte("x"), 3*outCap)},
	}
	for _, c := range metaCases() {
		req, sc := c.scratch()
		out["respond/"+c.name] = (&Service{headers: c.mode}).respond(req, sc)
	}
	for _, mode := range []HeaderMode{HeadersIETF, HeadersDraft03, HeadersNone} {
		e := newEnv(t, testFiles, Options{Headers: mode})
		override := desc("user", "v")
		override.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 2, Unit: 1}
		reqs := map[string]*rlsv3.RateLimitRequest{
			"ok":       request("test", desc("user", "u"), desc("tenant", "a", "plan", "gold"), desc("free", "x")),
			"override": request("test", override),
			"unknown":  request("nope", desc("user", "u")),
		}
		for i := 0; i < 20; i++ {
			reqs["over"] = request("test", desc("user", "w"), desc("multi", "m"))
			resp, err := e.svc.ShouldRateLimit(context.Background(), reqs["over"])
			if err != nil {
				t.Fatal(err)
			}
			if resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT {
				out[mode.String()+"/over"] = resp
				break
			}
		}
		if out[mode.String()+"/over"] == nil {
			t.Fatalf("%v: 20 requests never went over the limit", mode)
		}
		delete(reqs, "over")
		for name, req := range reqs {
			resp, err := e.svc.ShouldRateLimit(context.Background(), req)
			if err != nil {
				t.Fatal(err)
			}
			out[mode.String()+"/"+name] = resp
		}
	}
	return out
}

// TestCodecWritesWhatProtoWrites checks that the Codec writes every
// response of the Service byte for byte as proto.Marshal does, with
// vtprotobuf or without, and that everyField decodes to what it encoded:
// its bytes differ, since the Go runtime writes the one oneof (a quota's
// valid_until) after the fields numbered above it, and vtprotobuf in order.
func TestCodecWritesWhatProtoWrites(t *testing.T) {
	codec := newCodec(t)
	for name, resp := range codecResponses(t) {
		enc, err := codec.Marshal(resp)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		// gRPC's codec returns a small message as a plain slice; the
		// Codec's vtprotobuf path, a buffer of the pool.
		if _, plain := enc[0].(mem.SliceBuffer); plain && VTProto() {
			t.Errorf("%s: not encoded by vtprotobuf into a pooled buffer", name)
		}
		got := enc.Materialize()
		enc.Free()
		if name == "every_field" {
			var dec rlsv3.RateLimitResponse
			if err := proto.Unmarshal(got, &dec); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if !proto.Equal(&dec, resp) {
				t.Errorf("%s: decoded\n%v\nwant\n%v", name, &dec, resp)
			}
			continue
		}
		want, err := proto.Marshal(resp)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s: Codec wrote\n%x\nproto.Marshal\n%x", name, got, want)
		}
	}
}

// TestCodecDecodesRequests checks Unmarshal: a ShouldRateLimit request in
// one buffer or split across several decodes as proto.Unmarshal decodes it,
// an invalid one becomes lenientRequest's InvalidArgument, and other
// messages go to gRPC's codec.
func TestCodecDecodesRequests(t *testing.T) {
	codec := newCodec(t)
	withHits := desc("user", "u")
	withHits.HitsAddend = wrapperspb.UInt64(3)
	for _, req := range []*rlsv3.RateLimitRequest{
		request("test", desc("user", "u"), desc("tenant", "a", "plan", "gold")),
		request("test", withHits),
		{Domain: "d", HitsAddend: 4},
	} {
		raw, err := proto.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		for _, parts := range []int{1, 2, 3} {
			var data mem.BufferSlice
			for i := range parts {
				data = append(data, mem.SliceBuffer(raw[i*len(raw)/parts:(i+1)*len(raw)/parts]))
			}
			var in lenientRequest
			if err := codec.Unmarshal(data, &in); err != nil {
				t.Fatal(err)
			}
			if in.err != nil || !proto.Equal(&in.req, req) {
				t.Errorf("%d buffers: decoded %v (error %v), want %v", parts, &in.req, in.err, req)
			}
		}
	}

	bad, err := proto.Marshal(request("test", desc("user", "u")))
	if err != nil {
		t.Fatal(err)
	}
	bad = bytes.Replace(bad, []byte("u"), []byte{0xff}, 1)
	var in lenientRequest
	if err := codec.Unmarshal(mem.BufferSlice{mem.SliceBuffer(bad)}, &in); err != nil {
		t.Fatal(err)
	}
	if status.Code(in.err) != codes.InvalidArgument {
		t.Errorf("invalid UTF-8 decoded with error %v, want InvalidArgument", in.err)
	}

	hc := &healthpb.HealthCheckRequest{Service: "envoy.service.ratelimit.v3.RateLimitService"}
	enc, err := codec.Marshal(hc)
	if err != nil {
		t.Fatal(err)
	}
	defer enc.Free()
	var got healthpb.HealthCheckRequest
	if err := codec.Unmarshal(enc, &got); err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(&got, hc) {
		t.Errorf("health request round trip: %v, want %v", &got, hc)
	}
}
