package rls

import (
	"fmt"
	"sync"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
)

// vtMarshaler is what go-control-plane generates for its messages with
// vtprotobuf (protoc-gen-go-vtproto, "marshal_strict" and "size"), in files
// built only with the vtprotobuf build tag. "Strict" writes the fields in
// field-number order and the unknown fields last, as proto.Marshal does for
// a message without a oneof (the Service's responses have none; the Go
// runtime writes a oneof after the fields numbered above it), so the two
// write the same bytes (TestCodecWritesWhatProtoWrites), without
// reflection. Unlike proto.Marshal it does not check that strings are UTF-8:
// every string of a Service's response is, since it comes from the
// configuration (YAML is UTF-8) or is written by respond in ASCII.
type vtMarshaler interface {
	SizeVT() int
	MarshalToSizedBufferVTStrict(dst []byte) (int, error)
}

// Codec is the gRPC codec of a server that registers the Service; give it
// to grpc.NewServer with grpc.ForceServerCodecV2. It speaks protobuf, as
// gRPC's own codec (which it calls for everything it does not do itself),
// and does two things faster:
//
//   - It decodes ShouldRateLimit's requests with decodeRequest directly,
//     without the protobuf runtime's wrapping of lenientRequest (one
//     allocation less per request).
//   - It encodes the responses with go-control-plane's generated vtprotobuf
//     code, when the binary is built with the vtprotobuf tag (make, the
//     Dockerfile and make bench build so): about a quarter of gRPC's codec's
//     time, into a pooled buffer (one allocation per response instead of
//     three). BenchmarkEncodeResponse and BenchmarkWireShouldRateLimit
//     measure both.
//
// Without the tag it encodes as gRPC's codec does, byte for byte: the
// service behaves the same either way, only slower. VTProto reports which.
type Codec struct {
	std encoding.CodecV2
	out *outPool // for the responses; its large pool, gRPC's, for the requests
}

// outCap is the capacity of outPool's buffers: above gRPC's pooling
// threshold (1 KiB), so that the transport gives them back when written,
// and room for a response of several descriptors with headers and body.
const outCap = 2048

// outPool is a mem.BufferPool of buffers of outCap bytes, which it does not
// clear (the encoder writes every byte it hands out), backed by gRPC's
// pool for longer ones. The Codec does not take gRPC's pool for every
// response: it clears a 4 KiB buffer for a response of a few hundred
// bytes, and gives one of at most 256 bytes a buffer that the transport
// cannot give back. (gRPC's codec pools no message of 1 KiB or less: it
// allocates one, which costs two allocations more than outPool.)
type outPool struct {
	small sync.Pool
	large mem.BufferPool
}

func (p *outPool) Get(n int) *[]byte {
	if n > outCap {
		return p.large.Get(n)
	}
	if b, ok := p.small.Get().(*[]byte); ok {
		*b = (*b)[:n]
		return b
	}
	b := make([]byte, n, outCap)
	return &b
}

func (p *outPool) Put(b *[]byte) {
	if cap(*b) != outCap {
		p.large.Put(b)
		return
	}
	p.small.Put(b)
}

// NewCodec returns the Codec.
func NewCodec() *Codec {
	return &Codec{
		// Registered by the init of grpcproto, which this file imports.
		std: encoding.GetCodecV2(grpcproto.Name),
		out: &outPool{large: mem.DefaultBufferPool()},
	}
}

// VTProto reports whether the binary has go-control-plane's vtprotobuf
// encoders (the vtprotobuf build tag), which Codec uses for responses.
func VTProto() bool {
	_, ok := any(&rlsv3.RateLimitResponse{}).(vtMarshaler)
	return ok
}

// Name is gRPC's name for protobuf, so that the codec serves the
// application/grpc and application/grpc+proto content types.
func (c *Codec) Name() string { return grpcproto.Name }

// Marshal encodes v, a message with vtprotobuf encoders into a pooled
// buffer (the transport gives it back once written), anything else with
// gRPC's codec.
func (c *Codec) Marshal(v any) (mem.BufferSlice, error) {
	m, ok := v.(vtMarshaler)
	if !ok {
		return c.std.Marshal(v)
	}
	size := m.SizeVT()
	buf := c.out.Get(size)
	// The generated code writes SizeVT bytes, back to front; the buffer is
	// not cleared, so anything else would send stale bytes.
	n, err := m.MarshalToSizedBufferVTStrict(*buf)
	if err == nil && n != size {
		err = fmt.Errorf("wrote %d bytes of %d (changed while encoded?)", n, size)
	}
	if err != nil {
		c.out.Put(buf)
		return nil, fmt.Errorf("rls: encoding %T: %w", v, err)
	}
	return mem.BufferSlice{mem.NewBuffer(buf, c.out)}, nil
}

// Unmarshal decodes a ShouldRateLimit request with lenientRequest.Unmarshal
// and anything else with gRPC's codec.
func (c *Codec) Unmarshal(data mem.BufferSlice, v any) error {
	r, ok := v.(*lenientRequest)
	if !ok {
		return c.std.Unmarshal(data, v)
	}
	r.Reset() // as proto.Unmarshal resets what it decodes into
	buf := data.MaterializeToBuffer(c.out.large)
	defer buf.Free()
	// Unmarshal keeps no reference to the bytes: decodeRequest and
	// proto.Unmarshal copy what they keep.
	return r.Unmarshal(buf.ReadOnlyData())
}
