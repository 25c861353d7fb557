package main

import (
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
)

// TestClockSkewRow checks the "clock skew" row of `nodes get`.
func TestClockSkewRow(t *testing.T) {
	t.Parallel()
	at := timestamppb.New(time.Date(2031, time.March, 4, 5, 6, 7, 0, time.UTC))
	for _, tc := range []struct {
		n    *apiv1.Node
		want string
	}{
		{&apiv1.Node{}, "-"},
		{&apiv1.Node{ClockSkew: durationpb.New(-5400*time.Second - 200*time.Millisecond), ClockSkewTime: at}, "5400 s behind (at 2031-03-04T05:06:07Z)"},
		{&apiv1.Node{ClockSkew: durationpb.New(2 * time.Second), ClockSkewTime: at}, "2 s ahead (at 2031-03-04T05:06:07Z)"},
	} {
		if got := clockSkew(tc.n); got != tc.want {
			t.Errorf("clockSkew(%v) = %q, want %q", tc.n.GetClockSkew(), got, tc.want)
		}
	}
}
