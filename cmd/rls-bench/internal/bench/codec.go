package bench

import (
	"errors"
	"fmt"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
)

// overallCode is a RateLimitResponse of which only overall_code is decoded:
// all a run counts. Decoding whole responses (statuses, headers, dynamic
// metadata as a Struct, by reflection) costs the generator CPU in
// proportion to what the server says rather than to the requests, and on a
// machine whose cores the generator shares with the server that CPU is taken
// from the server (Options.FullDecode restores it).
type overallCode struct {
	code rlsv3.RateLimitResponse_Code
}

// fieldOverallCode is overall_code's field number in RateLimitResponse.
const fieldOverallCode = 1

// parse reads b, a serialized RateLimitResponse: the last overall_code in it
// wins, as in proto3; every other field is skipped, but checked to be
// well-formed.
func (r *overallCode) parse(b []byte) error {
	r.code = rlsv3.RateLimitResponse_UNKNOWN
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return fmt.Errorf("response: %w", protowire.ParseError(n))
		}
		b = b[n:]
		if num == fieldOverallCode && typ == protowire.VarintType {
			v, m := protowire.ConsumeVarint(b)
			if m < 0 {
				return fmt.Errorf("response: overall_code: %w", protowire.ParseError(m))
			}
			r.code = rlsv3.RateLimitResponse_Code(int32(v))
			b = b[m:]
			continue
		}
		m := protowire.ConsumeFieldValue(num, typ, b)
		if m < 0 {
			return fmt.Errorf("response: field %d: %w", num, protowire.ParseError(m))
		}
		b = b[m:]
	}
	return nil
}

// codeCodec is the proto codec, except that it decodes into an *overallCode
// by reading overall_code alone.
type codeCodec struct {
	proto encoding.CodecV2
}

func newCodeCodec() (codeCodec, error) {
	c := encoding.GetCodecV2("proto")
	if c == nil {
		return codeCodec{}, errors.New("grpc has no proto codec registered")
	}
	return codeCodec{proto: c}, nil
}

func (c codeCodec) Marshal(v any) (mem.BufferSlice, error) { return c.proto.Marshal(v) }

func (c codeCodec) Unmarshal(data mem.BufferSlice, v any) error {
	r, ok := v.(*overallCode)
	if !ok {
		return c.proto.Unmarshal(data, v)
	}
	if len(data) == 1 {
		return r.parse(data[0].ReadOnlyData())
	}
	return r.parse(data.Materialize())
}

func (c codeCodec) Name() string { return c.proto.Name() }
