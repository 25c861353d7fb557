package sinks

import (
	"bufio"
	"context"
	"fmt"
	"os"

	"github.com/better-compute/better-compute/controlplane/store"
)

// File appends each entry's CloudEvents envelope as one JSON line to a file
// and syncs it.
type File struct {
	// SinkName is the sink's name.
	SinkName string
	// Path is the file, created mode 0640 when absent.
	Path string
}

// Name names the sink.
func (f *File) Name() string { return f.SinkName }

// Deliver appends the entries and fsyncs.
func (f *File) Deliver(_ context.Context, entries []*store.OutboxEntry) error {
	fh, err := os.OpenFile(f.Path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o640)
	if err != nil {
		return fmt.Errorf("file sink %s: %w", f.SinkName, err)
	}
	w := bufio.NewWriter(fh)
	for _, e := range entries {
		w.Write(envelope(e))
		w.WriteByte('\n')
	}
	if err := w.Flush(); err != nil {
		fh.Close()
		return fmt.Errorf("file sink %s: %w", f.SinkName, err)
	}
	if err := fh.Sync(); err != nil {
		fh.Close()
		return fmt.Errorf("file sink %s: %w", f.SinkName, err)
	}
	return fh.Close()
}
