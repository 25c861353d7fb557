// Package recording records the shells a control-plane process relays
// (docs/tunnels.md, "Recorded shells"; DESIGN.md, "Tenancy and policies":
// shell sessions are recorded, sealed).
//
// A Recorder sits on a shell's two hops (Hops): what the client typed
// (input), what the node printed (output) and each window size (resize),
// each with its time since the shell opened, in the order they passed.
// Events gather in a buffer that is sealed and stored as one numbered chunk
// when it holds Config.FlushBytes, every Config.FlushInterval, and at the
// end; a chunk's plaintext is an apiv1.RecordingChunk, sealed with
// pki.Seal under the deployment secret with additional data naming the
// recording and the chunk's number (AAD), so a chunk moved to another
// recording or place does not open.
//
// A recording is bounded: past Config.MaxBytes data bytes (both ways
// together) it fails with ErrLimit. A failure (that, or a chunk the
// database would not take) closes Failed; the caller decides, from
// host.gateway.tunnels.recording.onFailure, whether the shell closes
// (Hops then refuses every further frame) or goes on unrecorded.
//
// Open and Parse read chunks back for recordings.get; Parse is the one
// parser of stored recording data and checks every event (Check).
package recording
