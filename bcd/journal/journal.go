package journal

import (
	"bytes"
	"cmp"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/better-compute/better-compute/bcd/internal/logkey"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// File is the journal's conventional name in bcd's data directory.
const File = "commands.journal"

// DefaultCompactSlack is Config.CompactSlack's default.
const DefaultCompactSlack = 1024

// DefaultReserve is Config.Reserve's default: 1 MiB, room for the start,
// result and delivery lines of thousands of commands already accepted.
const DefaultReserve = 1 << 20

// ErrClosed is returned by the methods of a closed Journal.
var ErrClosed = errors.New("command journal closed")

// ErrDiskFull marks a change the journal could not make for want of space
// on its filesystem: a write failed with ENOSPC or EDQUOT, or, for Accept,
// less than Config.Reserve was free. Nothing of the change was written.
var ErrDiskFull = errors.New("disk full")

// Log attribute keys of this package.
const (
	attrPath    = "path"
	attrOffset  = "offset"
	attrDropped = "dropped_bytes"
)

// Record is what the journal knows of one command.
type Record struct {
	// ID is the command id, the idempotency key.
	ID string `json:"id"`
	// Kind is the command's kind ("exec", "reboot", ...).
	Kind string `json:"kind,omitempty"`
	// BootID is /proc/sys/kernel/random/boot_id when it was accepted.
	BootID string `json:"boot_id,omitempty"`
	// AcceptedAt is when bcd accepted it.
	AcceptedAt time.Time `json:"accepted_at,omitzero"`
	// PGID is the process group it runs in; 0 when it started none in bcd
	// (yet, or ever: kinds that run no process, root work the helper runs).
	PGID int `json:"pgid,omitempty"`
	// StartTicks is the start time of the group's leader, field 22 of
	// /proc/<PGID>/stat (clock ticks since boot); with BootID it tells the
	// process apart from a later one given the same pid.
	StartTicks uint64 `json:"start_ticks,omitempty"`
	// Result is the terminal result; nil while the command has none.
	Result *sessionv1.CommandResult `json:"-"`
	// Delivered reports that Result reached a gateway.
	Delivered bool `json:"delivered,omitempty"`
	// HandedOver reports that the command was handed to the bcd that
	// replaced this one (an upgrade's restart), which answers it.
	HandedOver bool `json:"handed_over,omitempty"`
}

// Config configures a Journal.
type Config struct {
	// Path is the journal file, created (mode 0600) when missing. Required.
	Path string
	// CompactSlack is how many lines beyond twice the live records the
	// file may hold before it is rewritten. Defaults to
	// DefaultCompactSlack (1,024).
	CompactSlack int
	// Reserve is the space Accept wants free on the journal's filesystem
	// before it records a new command, so that the commands it accepted
	// can still record their process group, result and delivery on a
	// filling disk. Defaults to DefaultReserve (1 MiB); negative: none.
	Reserve int64
	// Logger defaults to discarding.
	Logger *slog.Logger
}

// Journal is the open journal. Its methods are safe for concurrent use;
// each change is on disk when the method returns nil.
type Journal struct {
	cfg Config
	log *slog.Logger

	mu    sync.Mutex
	f     *os.File // nil once closed
	size  int64    // bytes of good lines in f
	lines int      // lines in f
	recs  map[string]*Record
	order []string // ids in acceptance order; may name forgotten ids
}

// ops of the lines.
const (
	opRecord    = "record" // a whole record (Accept, compaction)
	opStarted   = "started"
	opFinished  = "finished"
	opDelivered = "delivered"
	opHandover  = "handover"
	opForget    = "forget"
)

// line is one line's JSON.
type line struct {
	Op string `json:"op"`
	Record
	ResultJSON json.RawMessage `json:"result,omitempty"`
}

var crcTable = crc32.MakeTable(crc32.Castagnoli)

// Open opens the journal at cfg.Path, reads its records, drops a torn last
// line and compacts it. Errors wrap the file operation that failed.
func Open(cfg Config) (*Journal, error) {
	if cfg.Path == "" {
		return nil, errors.New("open command journal: no path")
	}
	cfg.CompactSlack = cmp.Or(cfg.CompactSlack, DefaultCompactSlack)
	cfg.Reserve = cmp.Or(cfg.Reserve, DefaultReserve)
	j := &Journal{cfg: cfg, log: cmp.Or(cfg.Logger, slog.New(slog.DiscardHandler)), recs: map[string]*Record{}}
	f, err := os.OpenFile(cfg.Path, os.O_RDWR|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open command journal: %w", err)
	}
	j.f = f
	data, err := os.ReadFile(cfg.Path)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("read command journal: %w", err)
	}
	j.size = j.replay(data)
	if j.size < int64(len(data)) {
		j.log.Warn("Dropped a torn record at the end of the command journal", attrPath, cfg.Path,
			attrOffset, j.size, attrDropped, int64(len(data))-j.size)
		if err := f.Truncate(j.size); err != nil {
			f.Close()
			return nil, fmt.Errorf("truncate command journal: %w", err)
		}
		if err := f.Sync(); err != nil {
			f.Close()
			return nil, fmt.Errorf("sync command journal: %w", err)
		}
	}
	if j.lines > len(j.recs) {
		if err := j.compact(); err != nil {
			// The records are read; the file is only longer than it needs
			// to be (a full disk must not keep bcd from starting).
			j.log.Warn("Could not compact the command journal", attrPath, cfg.Path, logkey.Err, err)
		}
	}
	return j, nil
}

// replay applies the good lines of data and returns the length of the good
// prefix.
func (j *Journal) replay(data []byte) int64 {
	var off int64
	for len(data) > 0 {
		i := bytes.IndexByte(data, '\n')
		if i < 0 {
			return off // torn: no newline
		}
		l, ok := decode(data[:i])
		if !ok {
			return off
		}
		j.apply(l)
		j.lines++
		off += int64(i + 1)
		data = data[i+1:]
	}
	return off
}

func decode(b []byte) (*line, bool) {
	if len(b) < 10 || b[8] != ' ' {
		return nil, false
	}
	var sum [4]byte
	if _, err := hex.Decode(sum[:], b[:8]); err != nil {
		return nil, false
	}
	body := b[9:]
	if crc32.Checksum(body, crcTable) != uint32(sum[0])<<24|uint32(sum[1])<<16|uint32(sum[2])<<8|uint32(sum[3]) {
		return nil, false
	}
	var l line
	if err := json.Unmarshal(body, &l); err != nil || l.ID == "" {
		return nil, false
	}
	if len(l.ResultJSON) > 0 {
		l.Result = &sessionv1.CommandResult{}
		if err := protojson.Unmarshal(l.ResultJSON, l.Result); err != nil {
			return nil, false
		}
	}
	return &l, true
}

func encode(l *line) ([]byte, error) {
	if l.Result != nil {
		b, err := protojson.Marshal(l.Result)
		if err != nil {
			return nil, err
		}
		l.ResultJSON = b
	}
	body, err := json.Marshal(l)
	if err != nil {
		return nil, err
	}
	out := make([]byte, 0, len(body)+10)
	out = fmt.Appendf(out, "%08x ", crc32.Checksum(body, crcTable))
	out = append(out, body...)
	return append(out, '\n'), nil
}

// apply changes the records by one line; lines about unknown ids change
// nothing.
func (j *Journal) apply(l *line) {
	if l.Op == opRecord {
		r := l.Record
		r.Result = l.Result
		if _, ok := j.recs[r.ID]; ok {
			j.order = slices.DeleteFunc(j.order, func(id string) bool { return id == r.ID })
		}
		j.recs[r.ID] = &r
		j.order = append(j.order, r.ID)
		return
	}
	r, ok := j.recs[l.ID]
	if !ok {
		return
	}
	switch l.Op {
	case opStarted:
		r.PGID, r.StartTicks = l.PGID, l.StartTicks
	case opFinished:
		r.Result = l.Result
	case opDelivered:
		r.Delivered = true
	case opHandover:
		r.HandedOver = true
	case opForget:
		delete(j.recs, l.ID)
	}
}

// Records returns copies of the records, in the order they were accepted.
func (j *Journal) Records() []Record {
	j.mu.Lock()
	defer j.mu.Unlock()
	out := make([]Record, 0, len(j.recs))
	for _, id := range j.order {
		if r, ok := j.recs[id]; ok {
			out = append(out, *r)
		}
	}
	return out
}

// Accept records a command bcd accepted, before it starts it: ID, Kind,
// BootID and AcceptedAt of r (a record of the same id is replaced). It
// fails with an error wrapping ErrDiskFull, writing nothing, when less than
// Config.Reserve is free on the journal's filesystem or the write finds it
// full.
func (j *Journal) Accept(r Record) error {
	if j.cfg.Reserve > 0 {
		dir := filepath.Dir(j.cfg.Path)
		if free, err := freeBytes(dir); err == nil && free < uint64(j.cfg.Reserve) {
			return fmt.Errorf("record command: %w: %d bytes free on the filesystem of %s, under the %d kept to record results",
				ErrDiskFull, free, dir, j.cfg.Reserve)
		}
	}
	return j.append(&line{Op: opRecord, Record: Record{ID: r.ID, Kind: r.Kind, BootID: r.BootID, AcceptedAt: r.AcceptedAt}})
}

// Started records the process group a command runs in and the start time
// of its leader.
func (j *Journal) Started(id string, pgid int, startTicks uint64) error {
	return j.append(&line{Op: opStarted, Record: Record{ID: id, PGID: pgid, StartTicks: startTicks}})
}

// Finished records a command's terminal result.
func (j *Journal) Finished(id string, res *sessionv1.CommandResult) error {
	return j.append(&line{Op: opFinished, Record: Record{ID: id, Result: res}})
}

// Delivered records that a command's result reached a gateway.
func (j *Journal) Delivered(id string) error {
	return j.append(&line{Op: opDelivered, Record: Record{ID: id}})
}

// HandedOver records that a command is left to the bcd that replaces this
// one.
func (j *Journal) HandedOver(id string) error {
	return j.append(&line{Op: opHandover, Record: Record{ID: id}})
}

// Forget removes a command's record.
func (j *Journal) Forget(id string) error {
	return j.append(&line{Op: opForget, Record: Record{ID: id}})
}

// append writes one line, fsyncs it and applies it.
func (j *Journal) append(l *line) error {
	b, err := encode(l)
	if err != nil {
		return fmt.Errorf("encode command journal record: %w", err)
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.f == nil {
		return ErrClosed
	}
	if _, err := j.f.Write(b); err != nil {
		// Never leave a torn line under later ones.
		_ = j.f.Truncate(j.size)
		return fmt.Errorf("write command journal: %w", diskFull(err))
	}
	if err := j.f.Sync(); err != nil {
		_ = j.f.Truncate(j.size)
		return fmt.Errorf("sync command journal: %w", diskFull(err))
	}
	j.size += int64(len(b))
	j.lines++
	j.apply(l)
	if j.lines > 2*len(j.recs)+j.cfg.CompactSlack {
		if err := j.compact(); err != nil {
			// The change is on disk; the journal is only longer than it
			// needs to be.
			j.log.Warn("Could not compact the command journal", attrPath, j.cfg.Path, logkey.Err, err)
		}
	}
	return nil
}

// compact rewrites the file with one line per live record. j.mu is held
// (or j is not shared yet).
func (j *Journal) compact() error {
	var buf bytes.Buffer
	order := make([]string, 0, len(j.recs))
	for _, id := range j.order {
		r, ok := j.recs[id]
		if !ok {
			continue
		}
		b, err := encode(&line{Op: opRecord, Record: *r})
		if err != nil {
			return fmt.Errorf("compact command journal: %w", err)
		}
		buf.Write(b)
		order = append(order, id)
	}
	tmp := j.cfg.Path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("compact command journal: %w", err)
	}
	if _, err := f.Write(buf.Bytes()); err != nil {
		f.Close()
		os.Remove(tmp)
		return fmt.Errorf("compact command journal: %w", err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		os.Remove(tmp)
		return fmt.Errorf("compact command journal: %w", err)
	}
	if err := os.Rename(tmp, j.cfg.Path); err != nil {
		f.Close()
		os.Remove(tmp)
		return fmt.Errorf("compact command journal: %w", err)
	}
	if d, err := os.Open(filepath.Dir(j.cfg.Path)); err == nil {
		_ = d.Sync()
		d.Close()
	}
	j.f.Close()
	j.f, j.size, j.lines, j.order = f, int64(buf.Len()), len(order), order
	return nil
}

// Close closes the file; later calls fail with ErrClosed.
func (j *Journal) Close() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.f == nil {
		return nil
	}
	err := j.f.Close()
	j.f = nil
	return err
}

// diskFull marks err with ErrDiskFull when it says the filesystem is full.
func diskFull(err error) error {
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
		return fmt.Errorf("%w: %w", ErrDiskFull, err)
	}
	return err
}

// freeBytes returns the space free to this process on dir's filesystem.
func freeBytes(dir string) (uint64, error) {
	var fs syscall.Statfs_t
	if err := syscall.Statfs(dir, &fs); err != nil {
		return 0, err
	}
	return fs.Bavail * uint64(fs.Bsize), nil
}
