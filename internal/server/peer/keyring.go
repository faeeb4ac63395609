package peer

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"sync/atomic"
)

// MinSecretBytes is the shortest secret accepted: 256 bits.
const MinSecretBytes = 32

// maxSecretFile bounds what LoadKeyring reads.
const maxSecretFile = 64 << 10

// Keyring holds the cluster secrets: the first is used to dial, every one
// is accepted. A nil *Keyring means no secret.
type Keyring struct {
	path string
	keys atomic.Pointer[[][]byte]
}

// LoadKeyring reads path: one secret per line, blank lines and lines that
// start with # ignored, surrounding white space trimmed.
func LoadKeyring(path string) (*Keyring, error) {
	k := &Keyring{path: path}
	if err := k.Reread(); err != nil {
		return nil, err
	}
	return k, nil
}

// Reread re-reads the file; on error the previous secrets stay.
func (k *Keyring) Reread() error {
	keys, err := readKeys(k.path)
	if err != nil {
		return err
	}
	k.keys.Store(&keys)
	return nil
}

// NewKeyring is a keyring of the given secrets, for tests and tools.
func NewKeyring(secrets ...[]byte) (*Keyring, error) {
	if len(secrets) == 0 {
		return nil, errors.New("no secret")
	}
	for i, s := range secrets {
		if len(s) < MinSecretBytes {
			return nil, fmt.Errorf("secret %d has %d bytes, want at least %d", i+1, len(s), MinSecretBytes)
		}
	}
	k := &Keyring{}
	k.keys.Store(&secrets)
	return k, nil
}

func (k *Keyring) all() [][]byte {
	if k == nil {
		return nil
	}
	return *k.keys.Load()
}

func (k *Keyring) primary() []byte {
	if all := k.all(); len(all) > 0 {
		return all[0]
	}
	return nil
}

func readKeys(path string) ([][]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read cluster secret: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxSecretFile+1))
	if err != nil {
		return nil, fmt.Errorf("read cluster secret %q: %w", path, err)
	}
	if len(data) > maxSecretFile {
		return nil, fmt.Errorf("cluster secret %q: larger than %d bytes", path, maxSecretFile)
	}
	var keys [][]byte
	for i, line := range bytes.Split(data, []byte("\n")) {
		line = bytes.TrimSpace(line)
		if len(line) == 0 || line[0] == '#' {
			continue
		}
		if len(line) < MinSecretBytes {
			return nil, fmt.Errorf("cluster secret %q line %d: %d bytes, want at least %d (e.g. openssl rand -hex 32)",
				path, i+1, len(line), MinSecretBytes)
		}
		keys = append(keys, bytes.Clone(line))
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("cluster secret %q: no secret in the file", path)
	}
	return keys, nil
}
