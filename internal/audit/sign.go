package audit

import (
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/nats-io/nkeys"

	"github.com/actionbus/actionbus/events"
)

// FormatSigned is the chain format of signed records (the record field
// "v"); records without it are format 1: hash-chained, unsigned.
const FormatSigned = 2

// sigContext prefixes the bytes an auditor signs: the signature of a
// record is Ed25519 over sigContext followed by the record's hash (64
// lower-case hex characters).
const sigContext = "actionbus.audit.v2:"

// The auditor's key is an nkeys account key pair: an Ed25519 key whose
// seed ("SA...") and public key ("A...") have nkeys' checksummed text
// form, the one NATS operators already handle. It is not a NATS account;
// only the encoding is borrowed.

// NewKey returns a new auditor key's seed.
func NewKey() ([]byte, error) {
	kp, err := nkeys.CreateAccount()
	if err != nil {
		return nil, err
	}
	return kp.Seed()
}

// LoadOrCreateKey reads the auditor's seed from path, or creates it there
// (mode 0600, and its public key in path+".pub") when the file does not
// exist: the embedded dev stack's key is made on first start and kept.
func LoadOrCreateKey(path string) (seed []byte, created bool, err error) {
	seed, err = os.ReadFile(path)
	if err == nil {
		seed = []byte(strings.TrimSpace(string(seed)))
		if _, err := keyPair(seed); err != nil {
			return nil, false, fmt.Errorf("audit: auditor key %s: %w", path, err)
		}
		return seed, false, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return nil, false, err
	}
	if seed, err = NewKey(); err != nil {
		return nil, false, err
	}
	kp, _ := keyPair(seed)
	pub, _ := kp.PublicKey()
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, false, err
	}
	// Written aside, then linked into place: a reader never sees half a
	// seed, and of two first starts at once one key wins.
	tmp, err := os.CreateTemp(filepath.Dir(path), ".auditor-key-*")
	if err != nil {
		return nil, false, err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(append(seed, '\n')); err != nil {
		tmp.Close()
		return nil, false, err
	}
	if err := tmp.Close(); err != nil {
		return nil, false, err
	}
	if err := os.Link(tmp.Name(), path); errors.Is(err, os.ErrExist) {
		return LoadOrCreateKey(path) // another start made it first
	} else if err != nil {
		return nil, false, err
	}
	if err := os.WriteFile(path+".pub", []byte(pub+"\n"), 0o644); err != nil {
		return nil, false, err
	}
	return seed, true, nil
}

// DefaultKeyFile is where the auditor keeps its seed unless configured:
// auditor.nk in the user's configuration directory (for example
// ~/.config/actionbus/auditor.nk); "" when there is none.
func DefaultKeyFile() string {
	dir, err := os.UserConfigDir()
	if err != nil {
		return ""
	}
	return filepath.Join(dir, "actionbus", "auditor.nk")
}

// keyPair decodes an auditor seed: it must be an account seed.
func keyPair(seed []byte) (nkeys.KeyPair, error) {
	kp, err := nkeys.FromSeed(seed)
	if err != nil {
		return nil, errors.New("not an nkeys seed")
	}
	if pub, err := kp.PublicKey(); err != nil || !nkeys.IsValidPublicAccountKey(pub) {
		return nil, errors.New("not an account seed (SA...)")
	}
	return kp, nil
}

// ParsePublicKey checks an auditor public key ("A...").
func ParsePublicKey(s string) (string, error) {
	s = strings.TrimSpace(s)
	if !nkeys.IsValidPublicAccountKey(s) {
		return "", fmt.Errorf("audit: %q is not an auditor public key (an nkeys account key, A...)", s)
	}
	return s, nil
}

// signingKey is kp's Ed25519 private key. nkeys' Sign derives it from
// the seed at every call, which was half the cost of each signature
// (measured: the key derivation was 4 % of the auditor's CPU under W4);
// the auditor derives it once. Ed25519 is deterministic: the signatures
// are those kp.Sign makes.
func signingKey(kp nkeys.KeyPair) (ed25519.PrivateKey, error) {
	seed, err := kp.Seed()
	if err != nil {
		return nil, err
	}
	_, raw, err := nkeys.DecodeSeed(seed)
	if err != nil {
		return nil, err
	}
	if len(raw) != ed25519.SeedSize {
		return nil, errors.New("audit: the auditor seed is not an Ed25519 seed")
	}
	return ed25519.NewKeyFromSeed(raw), nil
}

// sign sets rec's signature: rec.Hash and rec.Signer must be set.
func sign(key ed25519.PrivateKey, rec *events.AuditRecorded) {
	rec.Sig = base64.RawURLEncoding.EncodeToString(ed25519.Sign(key, []byte(sigContext+rec.Hash)))
}

// signatureValid reports whether rec's signature is pub's over its hash.
func signatureValid(pub string, rec events.AuditRecorded) bool {
	sig, err := base64.RawURLEncoding.DecodeString(rec.Sig)
	if err != nil {
		return false
	}
	kp, err := nkeys.FromPublicKey(pub)
	if err != nil {
		return false
	}
	return kp.Verify([]byte(sigContext+rec.Hash), sig) == nil
}
