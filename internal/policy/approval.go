package policy

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"strings"
	"time"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/internal/canonical"
)

// InputHash is the stable input hash: SHA-256, as lower-case hex, over the
// RFC 8785 (JSON Canonicalization Scheme) form of the input as the action
// receives it (after alias rewrite and stripping). null values are kept.
// docs/approvals.md shows worked examples an approval service in any
// language can reproduce.
func InputHash(input any) (string, error) {
	if input == nil {
		input = map[string]any{}
	}
	return canonical.Hash(input)
}

// ApprovalContext is what an approval is bound to. A token signs all of it:
// changing any field invalidates the token.
type ApprovalContext struct {
	ApprovalID  string   `json:"approvalId"`
	RunID       string   `json:"runId"`
	StepID      string   `json:"stepId"`
	UserID      string   `json:"userId"`
	Action      string   `json:"action"`
	InputHash   string   `json:"inputHash"`
	ResourceIDs []string `json:"resourceIds,omitempty"`
	DryRunHash  string   `json:"dryRunHash,omitempty"`
	// DryRunAction is the action whose dry run DryRunHash names.
	DryRunAction string `json:"dryRunAction,omitempty"`
	// DryRunMatches says whether the input to approve, without its
	// dryRunHash key, is the input of one of the run's successful dry
	// runs; DryRunHash and DryRunAction are set only when it is.
	DryRunMatches bool      `json:"dryRunMatches"`
	ExpiresAt     time.Time `json:"expiresAt"`
}

// canonical is the signed form of the context: RFC 8785 JSON, with the
// expiry in UTC RFC 3339 (seconds).
func (c ApprovalContext) canonical() ([]byte, error) {
	c.ExpiresAt = c.ExpiresAt.UTC().Truncate(time.Second)
	return canonical.Marshal(c)
}

// Keys are the HMAC keys tokens are signed with, by key id. Several keys
// can be valid at once, so keys rotate without invalidating pending
// approvals signed with the previous key.
type Keys map[string][]byte

// ParseKeys reads "kid:base64secret,kid2:base64secret" (standard or URL
// base64). An empty string gives no keys.
func ParseKeys(s string) (Keys, error) {
	k := Keys{}
	for i, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		// An error names the key by position, never by content: a
		// malformed entry may be nothing but the secret.
		id, secret, ok := strings.Cut(part, ":")
		if !ok || id == "" || strings.ContainsAny(id, ". ") {
			return nil, fmt.Errorf("policy: approval key %d: want kid:base64secret (a key id without dots or spaces)", i+1)
		}
		raw, err := base64.StdEncoding.DecodeString(secret)
		if err != nil {
			if raw, err = base64.RawURLEncoding.DecodeString(secret); err != nil {
				return nil, fmt.Errorf("policy: approval key %s: secret is not base64", id)
			}
		}
		if len(raw) < 16 {
			return nil, fmt.Errorf("policy: approval key %s: secret must be at least 16 bytes", id)
		}
		k[id] = raw
	}
	return k, nil
}

// Sign returns the token of a context: "<kid>.<base64url HMAC-SHA256 of
// the canonical context>".
func Sign(kid string, key []byte, c ApprovalContext) (string, error) {
	canon, err := c.canonical()
	if err != nil {
		return "", err
	}
	m := hmac.New(sha256.New, key)
	m.Write(canon)
	return kid + "." + base64.RawURLEncoding.EncodeToString(m.Sum(nil)), nil
}

// Verify checks a token against the stored context: the key id must be
// known, the signature must match the context exactly, and the context
// must not have expired. Errors are *actionbus.Error with code
// approval_invalid or approval_expired.
func (k Keys) Verify(token string, c ApprovalContext, now time.Time) error {
	kid, sig, ok := strings.Cut(token, ".")
	if !ok {
		return actionbus.Errorf(actionbus.CodeApprovalInvalid, "malformed approval token")
	}
	key, known := k[kid]
	if !known {
		return actionbus.Errorf(actionbus.CodeApprovalInvalid, "approval token signed with unknown key %q", kid)
	}
	want, err := Sign(kid, key, c)
	if err != nil {
		return err
	}
	if !hmac.Equal([]byte(want), []byte(kid+"."+sig)) {
		return actionbus.Errorf(actionbus.CodeApprovalInvalid, "approval token does not match the approval context")
	}
	if !now.Before(c.ExpiresAt) {
		return actionbus.Errorf(actionbus.CodeApprovalExpired, "approval expired at %s", c.ExpiresAt.UTC().Format(time.RFC3339))
	}
	return nil
}
