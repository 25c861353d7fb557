package api

import (
	"context"
	"errors"
	"strconv"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/better-compute/better-compute/controlplane/internal/logkey"
	"github.com/better-compute/better-compute/controlplane/pkg/iam"
	"github.com/better-compute/better-compute/controlplane/pkg/recording"
	"github.com/better-compute/better-compute/controlplane/store"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
)

// Limits of recordings.get (docs/tunnels.md, "Recorded shells").
const (
	// recordingPageChunks is the most chunks one recordings.get returns.
	recordingPageChunks = 64
	// recordingPageBytes bounds the sealed bytes of one recordings.get's
	// chunks past the first (1 MiB).
	recordingPageBytes = 1 << 20
)

// recordingsList lists shell recordings, newest first. Every viewer of the
// deployment sees every recording until tenants scope them.
func (s *Server) recordingsList(ctx context.Context, _ *iam.Principal, r *apiv1.ListRecordingsRequest) (*apiv1.ListRecordingsResponse, error) {
	lp, err := page(r.GetPage())
	if err != nil {
		return nil, err
	}
	q := store.RecordingListParams{ListParams: lp}
	if r.GetNode() != "" {
		if err := id("node", r.GetNode()); err != nil {
			return nil, err
		}
		q.NodeID = r.GetNode()
	}
	recs, err := s.store.RecordingList(ctx, &q)
	if err != nil {
		return nil, err
	}
	out := &apiv1.ListRecordingsResponse{NextCursor: next(recs, lp, func(x *store.Recording) string { return x.ID })}
	for _, x := range recs {
		out.Recordings = append(out.Recordings, recordingOut(x))
	}
	return out, nil
}

// recordingsGet returns a recording and a page of its events, opened
// under the deployment secret.
func (s *Server) recordingsGet(ctx context.Context, _ *iam.Principal, r *apiv1.GetRecordingRequest) (*apiv1.GetRecordingResponse, error) {
	if err := id("id", r.GetId()); err != nil {
		return nil, err
	}
	after := -1
	if c := r.GetCursor(); c != "" {
		n, err := strconv.Atoi(c)
		if err != nil || n < 0 {
			return nil, invalid("cursor", "is not a cursor this API returned")
		}
		after = n
	}
	rec, err := s.store.RecordingGet(ctx, r.GetId())
	if errors.Is(err, store.ErrNotFound) {
		return nil, &Error{Code: apiv1.CodeNotFound, Field: "id", Message: "no recording " + r.GetId()}
	}
	if err != nil {
		return nil, err
	}
	chunks, err := s.store.RecordingChunks(ctx, &store.RecordingChunksParams{RecordingID: rec.ID, After: after,
		Limit: recordingPageChunks, MaxBytes: recordingPageBytes})
	if err != nil {
		return nil, err
	}
	out := &apiv1.GetRecordingResponse{Recording: recordingOut(rec)}
	for _, c := range chunks {
		events, err := recording.Open(s.cfg.Secret, c)
		if err != nil {
			s.log.ErrorContext(ctx, "Recording chunk does not open", "recording_id", rec.ID, "seq", c.Seq, logkey.Err, err)
			return nil, &Error{Code: apiv1.CodeInternal, Message: err.Error() + " (sealed under another deployment secret, or damaged)"}
		}
		out.Events = append(out.Events, events...)
	}
	if n := len(chunks); n > 0 && chunks[n-1].Seq+1 < rec.Chunks {
		out.NextCursor = strconv.Itoa(chunks[n-1].Seq)
	}
	return out, nil
}

// recordingOut is a recording in the API's form.
func recordingOut(r *store.Recording) *apiv1.Recording {
	out := &apiv1.Recording{Id: r.ID, TunnelId: r.TunnelID, NodeId: r.NodeID, CreatedBy: r.CreatedBy, AsRoot: r.AsRoot,
		StartTime: timestamppb.New(r.StartedAt), Bytes: r.Bytes, Chunks: int32(r.Chunks), State: r.State, Reason: r.Reason}
	if r.EndedAt != nil {
		out.EndTime = timestamppb.New(*r.EndedAt)
	}
	return out
}
