package redisbackend

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"strings"

	"github.com/envoy-rls/envoy-rls/pkg/limiter"
)

// Key format
//
// Every counter is one key
//
//	<prefix>{<id>}
//
// where <id> is the first 16 bytes (128 bits) of
//
//	SHA-256( "rls2" || uvarint(len(Request.Key)) || Request.Key || algorithm byte || uvarint(window ms) [|| "log2"] )
//
// encoded with unpadded base64url (22 characters of [A-Za-z0-9_-]). Its value
// depends on the algorithm (see the header of each lua/ file):
//
//	sliding_window   24-byte string: bucket, count, count of the bucket before
//	fixed_window     24-byte string: bucket, count, 0
//	token_bucket     24-byte string: at, debt, per
//	sliding_log      sorted set of batches of hits, a running total in each
//
// (the strings are three little-endian 64-bit integers: state_format in
// lua/lib.lua).
//
// One key per counter keeps Redis memory at one small string per active
// client and limit, lets the check read every counter of a request with one
// MGET of keys that Go computed, and leaves Lua no key to build.
//
// Request.Key is already an unambiguous, length-prefixed encoding of the
// domain, the rule identity and the descriptor entries; wrapping it in one more
// length prefix makes the tuple (Key, algorithm, window) unambiguous too. No
// descriptor value appears in a key, so no value can choose the Redis Cluster
// slot (the hash tag is always the 22-character id) or collide with another
// descriptor's counter except by a SHA-256 collision on 128 bits. SHA-256 is
// used rather than a fast non-cryptographic hash because descriptor values come
// from clients: an attacker must not be able to steer two counters onto one key.
// With SHA-NI it costs well under a microsecond per key.
//
// Besides counters the backend keeps one sorted set of live instances,
// <prefix>instances (see Backend.Beat).

const (
	// idLen is the length of the encoded id inside the braces.
	idLen = 22
	// keyVersion is hashed in front of every identity, so that a change of
	// the encoding or of the stored values cannot collide with older keys:
	// "rls1" kept a windowed counter as one integer key per bucket
	// (<prefix>{<id>}:<bucket>) and the others under suffixes ":tb", ":log".
	keyVersion = "rls2"
	// slidingLogVersion ends a sliding log's identity: its value changed
	// from one member per hit to one member per batch with a running total
	// (lua/sliding_log.lua), which an older instance would misread. The
	// other algorithms' keys, whose values did not change, keep theirs.
	slidingLogVersion = "log2"
)

// appendBaseKey appends the key "<prefix>{<id>}" of the counter of r to dst.
func appendBaseKey(dst []byte, prefix string, r *limiter.Request) []byte {
	var buf [128]byte
	id := buf[:0]
	id = append(id, keyVersion...)
	id = limiter.AppendKeyPart(id, r.Key)
	id = append(id, byte(r.Limit.Algorithm))
	id = binary.AppendUvarint(id, uint64(r.Limit.Window.Milliseconds()))
	if r.Limit.Algorithm == limiter.SlidingLog {
		id = append(id, slidingLogVersion...)
	}
	sum := sha256.Sum256(id)
	dst = append(dst, prefix...)
	dst = append(dst, '{')
	dst = base64.RawURLEncoding.AppendEncode(dst, sum[:16])
	return append(dst, '}')
}

// hashTag returns the part of key Redis Cluster hashes: the content of the
// first {...} with at least one character, or the whole key.
func hashTag(key string) string {
	if s := strings.IndexByte(key, '{'); s >= 0 {
		if e := strings.IndexByte(key[s+1:], '}'); e > 0 {
			return key[s+1 : s+1+e]
		}
	}
	return key
}

// slot returns the Redis Cluster hash slot of key (CRC16/XMODEM of its hash
// tag, modulo 16384), as CLUSTER KEYSLOT computes it.
func slot(key string) int {
	return int(crc16(hashTag(key)) & 16383)
}

// crc16 is CRC-16/XMODEM (polynomial 0x1021, initial value 0), the checksum
// Redis Cluster uses for key slots.
func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc = crc<<8 ^ crc16Table[byte(crc>>8)^s[i]]
	}
	return crc
}

// crc16Table is CRC16/XMODEM (polynomial 0x1021) of every byte value: a
// byte at a time instead of a bit at a time (the bitwise loop cost 4.9% of
// envoy-rls's CPU on a Cluster, at two slot computations per counter).
// Read-only after package initialization.
var crc16Table = func() (t [256]uint16) {
	for i := range t {
		crc := uint16(i) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
		t[i] = crc
	}
	return t
}()
