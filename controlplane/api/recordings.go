package api

import (
	"context"
	"errors"
	"strconv"
	"strings"

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
// recordingsList lists recordings; a tenant's caller gets those of shells
// its subtree's tokens opened (recordingSeen): a page may hold fewer than
// its limit, its cursor follows the page read.
func (s *Server) recordingsList(ctx context.Context, p *iam.Principal, r *apiv1.ListRecordingsRequest) (*apiv1.ListRecordingsResponse, error) {
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
	seen := map[string]bool{}
	for _, x := range recs {
		ok, cached := seen[x.CreatedBy]
		if !cached {
			if ok, err = s.recordingSeen(ctx, p, x); err != nil {
				return nil, err
			}
			seen[x.CreatedBy] = ok
		}
		if ok {
			out.Recordings = append(out.Recordings, recordingOut(x))
		}
	}
	return out, nil
}

// recordingsGet returns a recording and a page of its events, opened
// under the deployment secret.
func (s *Server) recordingsGet(ctx context.Context, p *iam.Principal, r *apiv1.GetRecordingRequest) (*apiv1.GetRecordingResponse, error) {
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
	if err == nil {
		var ok bool
		if ok, err = s.recordingSeen(ctx, p, rec); err == nil && !ok {
			err = store.ErrNotFound // another tenant's: as one that does not exist
		}
	}
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

// recordingSeen reports whether p sees rec: a recording is the tenant's of
// the token that opened its shell (docs/tenants.md), as an audit row is
// its caller's, so what a tenant's people typed is that tenant's only,
// whichever node (its own, or another's through a reservation's grant) it
// was typed on. A root caller sees every recording.
func (s *Server) recordingSeen(ctx context.Context, p *iam.Principal, rec *store.Recording) (bool, error) {
	if within(p) == "" {
		return true, nil
	}
	tok, ok := strings.CutPrefix(rec.CreatedBy, "token:")
	if !ok {
		return false, nil
	}
	return s.tokenSeen(ctx, p, tok)
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
