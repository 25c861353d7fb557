// Package identity keeps a joined node's identity on disk, under bcd's data
// directory (DefaultDir, /var/lib/bcd):
//
//	node.key        the node's private key (ECDSA P-256, PKCS #8 PEM), mode 0600
//	node.crt        its certificate chain, leaf first (PEM)
//	node-ca.crt     the node CA roots (PEM)
//	gateway-ca.crt  the CA pool gateways are verified against, only when the
//	                node joined with --ca-file (PEM)
//	identity.json   node id, trust domain, SPIFFE id, gateway URLs, the
//	                gateway pin, renew-after time, pool, site and region
//
// Every file is written atomically (a temporary file in the same directory,
// fsync, rename, fsync of the directory), so a crash leaves either the old
// or the new content. identity.json is written last by Save and its
// presence is what makes a directory hold an identity. A renewal rewrites
// node.crt, node-ca.crt and identity.json and keeps the key, so a crash in
// between leaves a certificate that matches the key and at worst an earlier
// renew-after time.
package identity
