package session

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// ErrSecretNotFound reports a secret the gateway does not have for this node
// (JoinService.Secret answered NOT_FOUND): it does not exist or is granted
// to another node.
var ErrSecretNotFound = errors.New("secret not found")

// Secret fetches the secret called name that the control plane sealed for
// this node (JoinService.Secret), over the current session's connection
// (mutual TLS with the node's certificate). The value must be kept in
// memory only and never logged. It fails with ErrNotConnected when there is
// no session and ErrSecretNotFound when the gateway has no such secret for
// the node; its errors never hold the value.
func (c *Client) Secret(ctx context.Context, name string) ([]byte, error) {
	c.mu.Lock()
	s := c.cur
	c.mu.Unlock()
	if s == nil {
		return nil, fmt.Errorf("secret %s: %w", name, ErrNotConnected)
	}
	resp, err := sessionv1.NewJoinServiceClient(s.cc).Secret(ctx, &sessionv1.SecretRequest{Name: name})
	if err != nil {
		if status.Code(err) == codes.NotFound {
			return nil, fmt.Errorf("secret %s: %w", name, ErrSecretNotFound)
		}
		return nil, fmt.Errorf("secret %s: %w", name, err)
	}
	return resp.GetValue(), nil
}
