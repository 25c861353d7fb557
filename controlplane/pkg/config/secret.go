package config

import (
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// SecretFile is the generated deployment secret of the embedded default,
// inside the data directory.
const SecretFile = "secret"

// EnsureEmbeddedSecret gives the embedded default its deployment secret:
// the one in DataDir/secret, generated (mode 0600) on first start. A
// configured secret wins.
func (c *Config) EnsureEmbeddedSecret() error {
	if c.Secret != "" || !c.Embedded {
		return nil
	}
	if err := os.MkdirAll(c.DataDir, 0o700); err != nil {
		return fmt.Errorf("create data dir: %w", err)
	}
	// Also when the directory existed with a wider mode.
	if err := os.Chmod(c.DataDir, 0o700); err != nil {
		return fmt.Errorf("restrict data dir: %w", err)
	}
	path := filepath.Join(c.DataDir, SecretFile)
	b, err := os.ReadFile(path)
	switch {
	case err == nil:
		if err := os.Chmod(path, 0o600); err != nil {
			return fmt.Errorf("restrict secret: %w", err)
		}
		c.Secret = strings.TrimSpace(string(b))
		if len(c.Secret) < MinSecretLen {
			return &Error{Key: "secret", Msg: path + " holds fewer than 32 characters"}
		}
		return nil
	case !errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("read secret: %w", err)
	}
	secret := rand.Text() + rand.Text() // 52 base32 characters, 260 bits
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("write secret: %w", err)
	}
	if _, err := f.WriteString(secret + "\n"); err != nil {
		f.Close()
		return fmt.Errorf("write secret: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write secret: %w", err)
	}
	c.Secret = secret
	return nil
}
