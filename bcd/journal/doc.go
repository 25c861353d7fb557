// Package journal keeps, in bcd's data directory, a durable record of every
// command bcd has accepted, so that commands survive bcd's own restarts
// without running twice (DESIGN.md, "Identity over time").
//
// # What it holds
//
// One Record per command id: its kind, the boot id and time at which it was
// accepted, the process group it runs in and the start time of that group's
// leader (field 22 of /proc/<pid>/stat, in clock ticks since boot), its
// terminal result once it has one, and whether that result has been
// delivered to a gateway. What the records mean after a restart (which
// command ran, which process group may be ended) is decided by the caller,
// package bcd/executor.
//
// # Format
//
// The journal is one append-only file (conventionally
// <data-dir>/commands.journal, mode 0600). Each change is one line,
//
//	<crc32c of the JSON, 8 hex digits> <JSON object>\n
//
// written with a single write and followed by fsync before the call returns,
// so a caller that starts a process after Accept returns knows the record is
// on disk. A crash can tear only the last line: Open reads up to the first
// line that is incomplete (no newline), fails its checksum or does not parse,
// and truncates the file there, so later appends follow a good record.
//
// # Compaction
//
// Open rewrites the file with one line per live record when the file holds
// more lines than that; while it runs, the file is rewritten the same way
// whenever its lines exceed twice the live records plus CompactSlack. The
// rewrite goes to a temporary file that is fsynced, renamed over the journal,
// and followed by an fsync of the directory, so a crash leaves either the old
// journal or the new one. Forget removes a record (the caller forgets
// delivered results it no longer needs to answer redeliveries with).
//
// # A full disk
//
// Accept refuses a new command, writing nothing, when less than
// Config.Reserve (1 MiB) is free on the journal's filesystem, so that the
// commands already accepted keep room to record their results; any change
// whose write or fsync fails with ENOSPC or EDQUOT is undone (the file is
// truncated back) and fails. Both errors wrap ErrDiskFull. Open reads a
// journal on a full disk; a compaction that finds no room leaves the file
// as it was.
package journal
