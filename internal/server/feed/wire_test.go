package feed

import (
	"encoding/binary"
	"testing"
)

// Run longer with:
//
//	go test ./internal/server/feed/ -run '^$' -fuzz '^FuzzFrameTracker$' -fuzztime 60s

// trackerStream builds a client byte stream from spec, two bytes per
// frame (flags, length), and reports after how many bytes the stream is at
// a message boundary and after how many at a frame boundary. It is the
// oracle for frameTracker, written from RFC 6455 section 5.2 apart from
// it: frames are built, not parsed.
func trackerStream(spec []byte) (stream []byte, boundary, frameEnd []bool) {
	boundary, frameEnd = []bool{true}, []bool{true}
	open := false // a fragmented data message is open
	for ; len(spec) >= 2; spec = spec[2:] {
		flags, n := spec[0], int(spec[1])
		control := flags&1 != 0
		fin := flags&2 != 0 || control
		masked := flags&4 != 0
		form := (flags >> 5) % 3 // length as 7 bits, 16 bits, or 64 bits
		var opcode byte
		switch {
		case control:
			opcode = opClose + (flags>>3)%3
			n %= 126
			form = 0
		case open:
			opcode = opContinuation
		default:
			opcode = opText
		}
		b0 := opcode
		if fin {
			b0 |= 0x80
		}
		frame := []byte{b0}
		var mask byte
		if masked {
			mask = 0x80
		}
		switch form {
		case 0:
			n %= 126
			frame = append(frame, mask|byte(n))
		case 1:
			n *= 3 // up to 765: some beyond 125, as a 16-bit length is meant for
			frame = append(frame, mask|126)
			frame = binary.BigEndian.AppendUint16(frame, uint16(n))
		default:
			n *= 7
			frame = append(frame, mask|127)
			frame = binary.BigEndian.AppendUint64(frame, uint64(n))
		}
		if masked {
			frame = append(frame, 1, 2, 3, 4)
		}
		frame = append(frame, make([]byte, n)...)
		if !control {
			open = !fin
		}
		for range len(frame) - 1 {
			boundary = append(boundary, false)
			frameEnd = append(frameEnd, false)
		}
		boundary = append(boundary, !open)
		frameEnd = append(frameEnd, true)
		stream = append(stream, frame...)
	}
	return stream, boundary, frameEnd
}

func TestFrameTracker(t *testing.T) {
	// Flags: 1 control, 2 FIN, 4 masked; bits 5-6 the length form.
	const (
		ctl, fin, masked = 1, 2, 4
		len16, len64     = 1 << 5, 2 << 5
	)
	tests := []struct {
		name string
		spec []byte
	}{
		{"nothing", nil},
		{"one message", []byte{fin | masked, 15}},
		{"empty message", []byte{fin | masked, 0}},
		{"two messages", []byte{fin | masked, 15, fin | masked, 3}},
		{"16-bit length", []byte{fin | masked | len16, 200}},
		{"64-bit length", []byte{fin | masked | len64, 10}},
		{"fragments", []byte{masked, 4, masked, 0, fin | masked, 11}},
		{"control frame between fragments", []byte{masked, 4, ctl | masked | 1<<3, 3, fin | masked, 11}},
		{"control frames only", []byte{ctl | masked | 1<<3, 5, ctl | masked | 2<<3, 0, ctl | masked, 2}},
		{"unmasked", []byte{fin, 9}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			checkTracker(t, tc.spec)
		})
	}
}

// checkTracker feeds the stream of spec to a tracker a byte at a time,
// and whole to another, comparing with the boundaries built.
func checkTracker(t *testing.T, spec []byte) {
	t.Helper()
	stream, want, wantFrame := trackerStream(spec)
	var tr frameTracker
	if !tr.atMessageBoundary() || !tr.atFrameBoundary() {
		t.Fatal("a new tracker is not at a boundary")
	}
	for i, b := range stream {
		tr.feed([]byte{b})
		if got := tr.atMessageBoundary(); got != want[i+1] {
			t.Fatalf("after %d of %d bytes (% x): boundary %v, want %v", i+1, len(stream), stream[:i+1], got, want[i+1])
		}
		if got := tr.atFrameBoundary(); got != wantFrame[i+1] {
			t.Fatalf("after %d of %d bytes (% x): frame boundary %v, want %v", i+1, len(stream), stream[:i+1], got, wantFrame[i+1])
		}
	}
	var whole frameTracker
	whole.feed(stream)
	if whole != tr {
		t.Fatalf("fed whole: %+v, byte by byte: %+v", whole, tr)
	}
}

// FuzzFrameTracker checks the tracker against streams built from random
// frame specs, fed a byte at a time and whole, and that arbitrary bytes
// never make it panic.
func FuzzFrameTracker(f *testing.F) {
	f.Add([]byte{0x06, 15, 0x06, 0})
	f.Add([]byte{0x04, 4, 0x0d, 3, 0x06, 11})
	f.Add([]byte{0x26, 200, 0x46, 10})
	f.Add([]byte{0x81, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, spec []byte) {
		checkTracker(t, spec)
		var tr frameTracker
		tr.feed(spec) // as raw bytes: anything goes, nothing panics
		_ = tr.atMessageBoundary()
	})
}
