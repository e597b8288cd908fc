package rls

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
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
		over := request("test", desc("user", "w"), desc("multi", "m"))
		for range 20 {
			resp, err := e.svc.ShouldRateLimit(context.Background(), over)
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
// response of the Service byte for byte as proto.Marshal does, and that everyField decodes to what it encoded:
// its bytes differ, since the Go runtime writes the one oneof (a quota's
// valid_until) after the fields numbered above it, and vtprotobuf in order.
func TestCodecWritesWhatProtoWrites(t *testing.T) {
	codec := NewCodec()
	for name, resp := range codecResponses(t) {
		enc, err := codec.Marshal(resp)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		// gRPC's codec returns a small message as a plain slice; the
		// Codec's vtprotobuf path, a buffer of the pool. (Without the
		// build tag, TestCodecHasVTProto is the test that says so.)
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
	codec := NewCodec()
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
	// Decoding again into the same message forgets the first request, as
	// proto.Unmarshal does.
	good := request("test", desc("user", "v"))
	raw, err := proto.Marshal(good)
	if err != nil {
		t.Fatal(err)
	}
	if err := codec.Unmarshal(mem.BufferSlice{mem.SliceBuffer(raw)}, &in); err != nil {
		t.Fatal(err)
	}
	if in.err != nil || !proto.Equal(&in.req, good) {
		t.Errorf("second decode: %v (error %v), want %v", &in.req, in.err, good)
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

// recordingCodec is gRPC's codec, counting the calls that reach it.
type recordingCodec struct {
	encoding.CodecV2
	calls int
}

func (r *recordingCodec) Marshal(v any) (mem.BufferSlice, error) {
	r.calls++
	return r.CodecV2.Marshal(v)
}

func (r *recordingCodec) Unmarshal(data mem.BufferSlice, v any) error {
	r.calls++
	return r.CodecV2.Unmarshal(data, v)
}

// TestCodecTakesItsOwnPaths checks that a ShouldRateLimit request, and a
// response when the binary has vtprotobuf encoders (VTProto), never reach
// gRPC's codec, and that a health check does. Without the vtprotobuf build
// tag the response goes to gRPC's codec, as Codec's doc says.
func TestCodecTakesItsOwnPaths(t *testing.T) {
	std := &recordingCodec{CodecV2: encoding.GetCodecV2(grpcproto.Name)}
	codec := NewCodec()
	codec.std = std
	raw, err := proto.Marshal(request("test", desc("user", "u")))
	if err != nil {
		t.Fatal(err)
	}
	var in lenientRequest
	if err := codec.Unmarshal(mem.BufferSlice{mem.SliceBuffer(raw)}, &in); err != nil {
		t.Fatal(err)
	}
	enc, err := codec.Marshal(everyField())
	if err != nil {
		t.Fatal(err)
	}
	enc.Free()
	want := 0 // the request and the response on the Codec's own paths
	if !VTProto() {
		want = 1 // the response through gRPC's codec
	}
	if std.calls != want {
		t.Errorf("a request and a response made %d calls to gRPC's codec, want %d (VTProto %v)", std.calls, want, VTProto())
	}
	enc, err = codec.Marshal(&healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	enc.Free()
	if std.calls != want+1 {
		t.Errorf("a health check request made %d calls to gRPC's codec, want 1", std.calls-want)
	}
}

// shortWriter is a vtMarshaler that reports size bytes and writes wrote,
// or fails.
type shortWriter struct {
	size, wrote int
	err         error
}

func (w shortWriter) SizeVT() int { return w.size }

func (w shortWriter) MarshalToSizedBufferVTStrict(dst []byte) (int, error) {
	if w.err != nil {
		return 0, w.err
	}
	copy(dst[len(dst)-w.wrote:], bytes.Repeat([]byte{1}, w.wrote))
	return w.wrote, nil
}

// TestCodecRefusesShortWrites checks that Marshal refuses an encoder that
// writes fewer bytes than it announced (its buffer is not cleared, so the
// rest would be stale bytes on the wire) and wraps an encoder's error.
func TestCodecRefusesShortWrites(t *testing.T) {
	codec := NewCodec()
	boom := errors.New("boom")
	for _, w := range []shortWriter{{size: 10, wrote: 8}, {size: 3 * outCap, wrote: 1}, {size: 10, err: boom}} {
		enc, err := codec.Marshal(w)
		if err == nil {
			enc.Free()
			t.Errorf("%+v: no error", w)
			continue
		}
		if w.err != nil && !errors.Is(err, w.err) {
			t.Errorf("%+v: error %v does not wrap %v", w, err, w.err)
		}
		if !strings.Contains(err.Error(), "rls: encoding rls.shortWriter") {
			t.Errorf("%+v: error %q does not name what it encoded", w, err)
		}
	}
	enc, err := codec.Marshal(shortWriter{size: 10, wrote: 10})
	if err != nil {
		t.Fatal(err)
	}
	defer enc.Free()
	if got := enc.Materialize(); !bytes.Equal(got, bytes.Repeat([]byte{1}, 10)) {
		t.Errorf("wrote %x", got)
	}
}
