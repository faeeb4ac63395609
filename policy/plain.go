package policy

import (
	"bytes"
	"encoding/binary"
)

// The helpers here find plain JSON strings for DecodeStored's fast path.

// plainString reads the JSON string at b[i] if it is printable ASCII with no
// escapes, whose Go value is its bytes.
func plainString(b []byte, i int) (s string, end int, ok bool) {
	if i >= len(b) || b[i] != '"' {
		return "", 0, false
	}
	q := bytes.IndexByte(b[i+1:], '"')
	if q < 0 || !plainRun(b[i+1:i+1+q]) {
		return "", 0, false
	}
	return string(b[i+1 : i+1+q]), i + q + 2, true
}

const ones, highs = 0x0101010101010101, 0x8080808080808080

// hasZero reports whether a byte of x is zero (exact as a boolean).
func hasZero(x uint64) bool { return (x-ones)&^x&highs != 0 }

// plainRun reports whether s is printable ASCII (0x20 to 0x7e) without a
// backslash. Policies are mostly long strings, so it tests eight bytes at a
// time.
func plainRun(s []byte) bool {
	for len(s) >= 8 {
		x := binary.LittleEndian.Uint64(s)
		if x&highs != 0 || // 0x80 and above
			(x-ones*0x20)&^x&highs != 0 || // below 0x20
			hasZero(x^(ones*0x7f)) || hasZero(x^(ones*'\\')) {
			return false
		}
		s = s[8:]
	}
	for _, c := range s {
		if c < 0x20 || c >= 0x7f || c == '\\' {
			return false
		}
	}
	return true
}
