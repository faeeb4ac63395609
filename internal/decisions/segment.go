package decisions

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"strconv"
	"strings"
)

// The on-disk format. A segment file is a header and then records, each
// framed on its own, all integers little-endian:
//
//	header (16 bytes, once per file)
//	  0  4  magic "PDDL"
//	  4  1  version (1)
//	  5  3  zero
//	  8  8  segment id, the same as in the file name
//
//	record frame (16 bytes + data)
//	  0  4  n, the length of data (at most MaxRecordBytes)
//	  4  4  CRC32C (Castagnoli) of bytes 0-4 and 8-(16+n): length, time, data
//	  8  8  time, Unix nanoseconds (never negative)
//	 16  n  data, opaque
//
// Files are named <id>-<first>.seg, both numbers 20 decimal digits: id
// counts up from 1 and is never reused, first is the Unix nanoseconds of
// the segment's first record as written (a crash may have taken it), so a
// listing sorts by age and shows it. The index keeps each segment's least
// and greatest times, read at Open, since arrival order is not time order.
const (
	headerSize = 16
	frameSize  = 16
	version    = 1
	segExt     = ".seg"
)

// magic opens every segment file.
var magic = [4]byte{'P', 'D', 'D', 'L'}

// castagnoli is CRC32C's table; most CPUs compute it in hardware.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// segName is the file name of segment id whose first record is at first
// (Unix nanoseconds).
func segName(id uint64, first int64) string {
	return fmt.Sprintf("%020d-%020d%s", id, first, segExt)
}

// parseSegName returns the id in a segment file name; false for any other
// name.
func parseSegName(name string) (uint64, bool) {
	base, ok := strings.CutSuffix(name, segExt)
	if !ok || len(base) != 41 || base[20] != '-' {
		return 0, false
	}
	id, err := strconv.ParseUint(base[:20], 10, 64)
	if err != nil || id == 0 {
		return 0, false
	}
	if _, err := strconv.ParseUint(base[21:], 10, 63); err != nil {
		return 0, false
	}
	return id, true
}

// appendHeader appends segment id's header to b.
func appendHeader(b []byte, id uint64) []byte {
	b = append(b, magic[:]...)
	b = append(b, version, 0, 0, 0)
	return binary.LittleEndian.AppendUint64(b, id)
}

// checkHeader says what is wrong with h as the header of segment id.
func checkHeader(h []byte, id uint64) error {
	switch {
	case len(h) < headerSize:
		return fmt.Errorf("header is %d bytes, want %d", len(h), headerSize)
	case [4]byte(h[:4]) != magic:
		return fmt.Errorf("no segment magic (%q)", h[:4])
	case h[4] != version:
		return fmt.Errorf("segment version %d, this build reads %d", h[4], version)
	case h[5]|h[6]|h[7] != 0:
		return fmt.Errorf("reserved header bytes %x are not zero", h[5:8])
	case binary.LittleEndian.Uint64(h[8:]) != id:
		return fmt.Errorf("header names segment %d, the file name %d", binary.LittleEndian.Uint64(h[8:]), id)
	}
	return nil
}

// appendFrame appends r's frame to b.
func appendFrame(b []byte, r Record) []byte {
	start := len(b)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(r.Data)))
	b = append(b, 0, 0, 0, 0) // the CRC, once the rest is in place
	b = binary.LittleEndian.AppendUint64(b, uint64(r.Time.UnixNano()))
	b = append(b, r.Data...)
	f := b[start:]
	binary.LittleEndian.PutUint32(f[4:], frameCRC(f[:4], f[8:]))
	return b
}

// frameCRC is the CRC of a frame's length bytes and of its time and data.
func frameCRC(length, rest []byte) uint32 {
	return crc32.Update(crc32.Checksum(length, castagnoli), castagnoli, rest)
}

// damage is a frame that cannot be read: short, too long or failing its CRC.
type damage struct {
	off    int64
	reason string
}

func (d *damage) Error() string { return fmt.Sprintf("bad record at offset %d: %s", d.off, d.reason) }

// reader reads the frames of one segment from an offset up to a limit.
type reader struct {
	r     *bufio.Reader
	off   int64 // of the next frame
	limit int64
	hdr   [frameSize]byte
	buf   []byte // the last record's data, reused
}

// readBufSize is a reader's buffer: large reads, a few per segment.
const readBufSize = 256 << 10

// newReader reads f's frames in [off, limit).
func newReader(f *os.File, off, limit int64) *reader {
	size := readBufSize
	if n := limit - off; n < int64(size) {
		size = max(int(n), 16)
	}
	return &reader{r: bufio.NewReaderSize(io.NewSectionReader(f, off, limit-off), size), off: off, limit: limit}
}

// next returns the next record, whose Data is valid until the following
// call; io.EOF exactly at the limit, a *damage for anything else.
func (rd *reader) next() (int64, []byte, error) {
	if rd.off == rd.limit {
		return 0, nil, io.EOF
	}
	if rd.limit-rd.off < frameSize {
		return 0, nil, &damage{rd.off, fmt.Sprintf("%d bytes left, short of a frame", rd.limit-rd.off)}
	}
	if _, err := io.ReadFull(rd.r, rd.hdr[:]); err != nil {
		return 0, nil, readErr(rd.off, err)
	}
	n := binary.LittleEndian.Uint32(rd.hdr[:4])
	if n > MaxRecordBytes {
		return 0, nil, &damage{rd.off, fmt.Sprintf("length %d is over the %d-byte cap", n, MaxRecordBytes)}
	}
	if left := rd.limit - rd.off - frameSize; int64(n) > left {
		return 0, nil, &damage{rd.off, fmt.Sprintf("length %d runs past the end (%d bytes left)", n, left)}
	}
	if cap(rd.buf) < int(n) {
		rd.buf = make([]byte, n, max(int(n), 1024))
	}
	rd.buf = rd.buf[:n]
	if _, err := io.ReadFull(rd.r, rd.buf); err != nil {
		return 0, nil, readErr(rd.off, err)
	}
	crc := crc32.Update(frameCRC(rd.hdr[:4], rd.hdr[8:]), castagnoli, rd.buf)
	if crc != binary.LittleEndian.Uint32(rd.hdr[4:8]) {
		return 0, nil, &damage{rd.off, "CRC mismatch"}
	}
	t := int64(binary.LittleEndian.Uint64(rd.hdr[8:]))
	if t < 0 {
		return 0, nil, &damage{rd.off, "negative time"}
	}
	rd.off += frameSize + int64(n)
	return t, rd.buf, nil
}

// readErr is an I/O error reading at off: a file that shrank under us
// reads as damage, anything else as itself.
func readErr(off int64, err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return &damage{off, "the file ends early"}
	}
	return fmt.Errorf("read at offset %d: %w", off, err)
}
