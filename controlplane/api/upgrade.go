package api

import (
	"context"
	"net/http"
	"net/url"
	"strings"

	"github.com/better-compute/better-compute/installer/manifest"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// upgradeCommandSpec checks an upgrade request and returns its spec in the
// session-protocol form: the version and the base URL the nodes download
// from, resolved now (the request's, downloads.publicURL, or this request's
// origin).
func (s *Server) upgradeCommandSpec(ctx context.Context, r *apiv1.CreateCommandsRequest) (*sessionv1.Command, error) {
	if r.Exec != nil {
		return nil, invalid("exec", "only for kind exec")
	}
	u := r.GetUpgrade()
	switch v := u.GetVersion(); {
	case v == "":
		return nil, invalid("upgrade.version", "is required for kind upgrade")
	case !manifest.ValidVersion(v):
		return nil, invalid("upgrade.version", "%q is not a release version: want semantic versioning without a leading v, like 0.2.0", v)
	}
	base := u.GetBaseUrl()
	if base == "" {
		base = s.downloadsURL(ctx)
		if base == "" {
			return nil, invalid("upgrade.baseUrl", "this control plane serves no downloads (set downloads.dir) and the request names no baseUrl")
		}
	}
	if p, err := url.Parse(base); err != nil || (p.Scheme != "https" && p.Scheme != "http") || p.Host == "" || p.RawQuery != "" || p.Fragment != "" {
		return nil, invalid("upgrade.baseUrl", "want an http(s)://host/path URL of a downloads route, such as https://compute.example.com/api/downloads")
	}
	return &sessionv1.Command{Spec: &sessionv1.Command_Upgrade{Upgrade: &sessionv1.UpgradeSpec{Version: u.GetVersion(),
		BaseUrl: strings.TrimRight(base, "/")}}}, nil
}

// downloadsURL is the downloads route as nodes reach it: configured, or
// derived from the origin of the request in ctx; "" when this API serves
// no downloads.
func (s *Server) downloadsURL(ctx context.Context) string {
	if s.cfg.DownloadsURL != "" {
		return s.cfg.DownloadsURL
	}
	origin, _ := ctx.Value(originKey{}).(string)
	if s.cfg.Downloads == nil || origin == "" {
		return ""
	}
	return origin + s.cfg.BasePath + "/downloads"
}

// originKey keys the scheme and host a request came to.
type originKey struct{}

// withOrigin records in the request's context the scheme and host it came
// to ("https://compute.example.com"): https when the connection is TLS or
// a proxy says it was (X-Forwarded-Proto: https).
func withOrigin(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		scheme := "http"
		if r.TLS != nil || strings.EqualFold(r.Header.Get("X-Forwarded-Proto"), "https") {
			scheme = "https"
		}
		next(w, r.WithContext(context.WithValue(r.Context(), originKey{}, scheme+"://"+r.Host)))
	}
}
