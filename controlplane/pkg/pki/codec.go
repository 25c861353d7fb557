package pki

import (
	"bytes"
	"crypto/x509"
	"encoding/json"
	"fmt"
)

// bundleFormat is the version of the JSON encoding of a Bundle. A change
// that older builds cannot read bumps it.
const bundleFormat = 1

// bundleAAD binds a sealed bundle to its use, so that another value sealed
// under the same secret cannot be passed off as a bundle.
const bundleAAD = "better-compute/pki/bundle/v1"

// bundleJSON is the encoded form of a Bundle.
type bundleJSON struct {
	Format             int      `json:"format"`
	TrustDomain        string   `json:"trustDomain"`
	NodeCA             caJSON   `json:"nodeCA"`
	GatewayCA          caJSON   `json:"gatewayCA"`
	InternalCA         caJSON   `json:"internalCA"`
	PreviousNodeRoots  []string `json:"previousNodeRoots,omitempty"`
	NextNodeCA         *caJSON  `json:"nextNodeCA,omitempty"`
	PreviousNodeCA     *caJSON  `json:"previousNodeCA,omitempty"`
	RetiredNodeRoots   []string `json:"retiredNodeRoots,omitempty"`
	NextGatewayCA      *caJSON  `json:"nextGatewayCA,omitempty"`
	PreviousGatewayCA  *caJSON  `json:"previousGatewayCA,omitempty"`
	NextInternalCA     *caJSON  `json:"nextInternalCA,omitempty"`
	PreviousInternalCA *caJSON  `json:"previousInternalCA,omitempty"`
}

// caJSON is the encoded form of a CA: PEM certificate and PKCS #8 PEM key.
type caJSON struct {
	Cert string `json:"cert"`
	Key  string `json:"key"`
}

// Marshal encodes b as JSON holding PEM certificates and PKCS #8 PEM
// private keys, with a format version. The output contains the CA keys in
// the clear: store it only through SealBundle. It fails with
// ErrBundleInvalid when b does not pass Validate.
func (b *Bundle) Marshal() ([]byte, error) {
	if err := b.Validate(); err != nil {
		return nil, fmt.Errorf("marshal pki bundle: %w", err)
	}
	out := bundleJSON{Format: bundleFormat, TrustDomain: b.TrustDomain}
	for _, ca := range []struct {
		src *CA
		dst *caJSON
	}{
		{b.NodeCA, &out.NodeCA},
		{b.GatewayCA, &out.GatewayCA},
		{b.InternalCA, &out.InternalCA},
	} {
		key, err := encodeKeyPEM(ca.src.Key)
		if err != nil {
			return nil, fmt.Errorf("marshal pki bundle: %w", err)
		}
		*ca.dst = caJSON{Cert: string(EncodeCertificatesPEM(ca.src.Cert)), Key: string(key)}
	}
	for _, root := range b.PreviousNodeRoots {
		out.PreviousNodeRoots = append(out.PreviousNodeRoots, string(EncodeCertificatesPEM(root)))
	}
	for _, root := range b.RetiredNodeRoots {
		out.RetiredNodeRoots = append(out.RetiredNodeRoots, string(EncodeCertificatesPEM(root)))
	}
	for _, ca := range []struct {
		src *CA
		dst **caJSON
	}{{b.NextNodeCA, &out.NextNodeCA}, {b.PreviousNodeCA, &out.PreviousNodeCA},
		{b.NextGatewayCA, &out.NextGatewayCA}, {b.PreviousGatewayCA, &out.PreviousGatewayCA},
		{b.NextInternalCA, &out.NextInternalCA}, {b.PreviousInternalCA, &out.PreviousInternalCA}} {
		if ca.src == nil {
			continue
		}
		key, err := encodeKeyPEM(ca.src.Key)
		if err != nil {
			return nil, fmt.Errorf("marshal pki bundle: %w", err)
		}
		*ca.dst = &caJSON{Cert: string(EncodeCertificatesPEM(ca.src.Cert)), Key: string(key)}
	}
	data, err := json.Marshal(out)
	if err != nil {
		return nil, fmt.Errorf("marshal pki bundle: %w", err)
	}
	return data, nil
}

// UnmarshalBundle decodes what Marshal encodes and checks the result with
// Validate. Unknown fields and other format versions are refused. Errors
// wrap ErrBundleInvalid.
func UnmarshalBundle(data []byte) (*Bundle, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var in bundleJSON
	if err := dec.Decode(&in); err != nil {
		return nil, fmt.Errorf("unmarshal pki bundle: %w: %w", ErrBundleInvalid, err)
	}
	if dec.More() {
		return nil, fmt.Errorf("unmarshal pki bundle: %w: data after the JSON object", ErrBundleInvalid)
	}
	if in.Format != bundleFormat {
		return nil, fmt.Errorf("unmarshal pki bundle: %w: format %d, want %d", ErrBundleInvalid, in.Format, bundleFormat)
	}
	b := &Bundle{TrustDomain: in.TrustDomain}
	for _, ca := range []struct {
		kind caKind
		src  caJSON
		dst  **CA
	}{
		{kindNode, in.NodeCA, &b.NodeCA},
		{kindGateway, in.GatewayCA, &b.GatewayCA},
		{kindInternal, in.InternalCA, &b.InternalCA},
	} {
		decoded, err := decodeCA(ca.src)
		if err != nil {
			return nil, fmt.Errorf("unmarshal pki bundle: %w: %s CA: %w", ErrBundleInvalid, ca.kind, err)
		}
		*ca.dst = decoded
	}
	for i, root := range in.PreviousNodeRoots {
		cert, err := parseOneCertificatePEM(root)
		if err != nil {
			return nil, fmt.Errorf("unmarshal pki bundle: %w: previous node root %d: %w", ErrBundleInvalid, i, err)
		}
		b.PreviousNodeRoots = append(b.PreviousNodeRoots, cert)
	}
	for i, root := range in.RetiredNodeRoots {
		cert, err := parseOneCertificatePEM(root)
		if err != nil {
			return nil, fmt.Errorf("unmarshal pki bundle: %w: retired node root %d: %w", ErrBundleInvalid, i, err)
		}
		b.RetiredNodeRoots = append(b.RetiredNodeRoots, cert)
	}
	for _, ca := range []struct {
		name string
		src  *caJSON
		dst  **CA
	}{{"next node", in.NextNodeCA, &b.NextNodeCA}, {"previous node", in.PreviousNodeCA, &b.PreviousNodeCA},
		{"next gateway", in.NextGatewayCA, &b.NextGatewayCA}, {"previous gateway", in.PreviousGatewayCA, &b.PreviousGatewayCA},
		{"next internal", in.NextInternalCA, &b.NextInternalCA}, {"previous internal", in.PreviousInternalCA, &b.PreviousInternalCA}} {
		if ca.src == nil {
			continue
		}
		decoded, err := decodeCA(*ca.src)
		if err != nil {
			return nil, fmt.Errorf("unmarshal pki bundle: %w: %s CA: %w", ErrBundleInvalid, ca.name, err)
		}
		*ca.dst = decoded
	}
	if err := b.Validate(); err != nil {
		return nil, fmt.Errorf("unmarshal pki bundle: %w", err)
	}
	return b, nil
}

func decodeCA(in caJSON) (*CA, error) {
	cert, err := parseOneCertificatePEM(in.Cert)
	if err != nil {
		return nil, err
	}
	key, err := parseKeyPEM([]byte(in.Key))
	if err != nil {
		return nil, err
	}
	return &CA{Cert: cert, Key: key}, nil
}

func parseOneCertificatePEM(s string) (*x509.Certificate, error) {
	certs, err := ParseCertificatesPEM([]byte(s))
	if err != nil {
		return nil, err
	}
	if len(certs) != 1 {
		return nil, fmt.Errorf("%d certificates, want 1", len(certs))
	}
	return certs[0], nil
}

// SealBundle marshals b and seals it under the deployment secret (Seal),
// the form in which the store keeps it. Errors are those of Marshal and
// Seal.
func (b *Bundle) SealBundle(secret string) ([]byte, error) {
	data, err := b.Marshal()
	if err != nil {
		return nil, fmt.Errorf("seal pki bundle: %w", err)
	}
	sealed, err := Seal(secret, data, []byte(bundleAAD))
	if err != nil {
		return nil, fmt.Errorf("seal pki bundle: %w", err)
	}
	return sealed, nil
}

// OpenBundle opens a bundle sealed by SealBundle under the same secret.
// A wrong secret fails with ErrSealOpen; other errors are those of Open and
// UnmarshalBundle.
func OpenBundle(secret string, sealed []byte) (*Bundle, error) {
	data, err := Open(secret, sealed, []byte(bundleAAD))
	if err != nil {
		return nil, fmt.Errorf("open pki bundle: %w", err)
	}
	b, err := UnmarshalBundle(data)
	if err != nil {
		return nil, fmt.Errorf("open pki bundle: %w", err)
	}
	return b, nil
}
