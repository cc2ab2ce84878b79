package httpapi

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/internal/policy"
)

// Roles a token may hold.
const (
	// RoleRead lists and follows runs, pending approvals, audit and the
	// catalog.
	RoleRead = "read"
	// RoleRun starts, cancels and answers runs (and reads).
	RoleRun = "run"
	// RoleApprove approves and denies pending approvals (and reads).
	RoleApprove = "approve"
)

// Token is one caller of the API: the SHA-256 of its bearer token (the
// token itself is never stored), the user it acts as (the user of the runs
// it starts, the approver of its answers), its roles in the API and its
// grants: the policy roles and scopes its runs hold (the policy's
// requireRoles and requireScopes read them, docs/approvals.md).
type Token struct {
	SHA256 string        `json:"sha256"`
	User   string        `json:"user"`
	Roles  []string      `json:"roles"`
	Grants policy.Grants `json:"grants,omitzero"`
}

// Tokens are the API's callers.
type Tokens struct {
	Tokens []Token `json:"tokens"`
}

// ParseTokens reads a tokens document:
// {"tokens": [{"sha256": "<hex>", "user": "alice", "roles": ["read", "run", "approve"],
// "grants": {"roles": ["finance"], "scopes": ["actions:run"]}}]}.
func ParseTokens(data []byte) (Tokens, error) {
	var t Tokens
	dec := json.NewDecoder(strings.NewReader(string(data)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&t); err != nil {
		return Tokens{}, fmt.Errorf("tokens: %w", err)
	}
	return t, t.Validate()
}

// Validate reports entries without a user, with an unknown role or a hash
// that is not SHA-256 hex.
func (t Tokens) Validate() error {
	for i, tok := range t.Tokens {
		if b, err := hex.DecodeString(tok.SHA256); err != nil || len(b) != sha256.Size {
			return fmt.Errorf("tokens[%d]: sha256 must be 64 hex digits", i)
		}
		if !policy.ValidApprover(tok.User) {
			return fmt.Errorf("tokens[%d]: user must be a user name (1 to 128 characters, no spaces or separators)", i)
		}
		for _, r := range tok.Roles {
			if r != RoleRead && r != RoleRun && r != RoleApprove {
				return fmt.Errorf("tokens[%d]: unknown role %q (read, run, approve)", i, r)
			}
		}
	}
	return nil
}

// NewToken makes a random bearer token and its entry for user and roles.
func NewToken(user string, roles ...string) (string, Token, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", Token{}, err
	}
	token := base64.RawURLEncoding.EncodeToString(b)
	return token, Token{SHA256: HashToken(token), User: user, Roles: roles}, nil
}

// HashToken returns the SHA-256 hex of a bearer token, as a tokens
// document holds it.
func HashToken(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

// errNoToken and errBadToken are why a request is not authenticated.
var (
	errNoToken  = errors.New("an Authorization: Bearer token is required")
	errBadToken = errors.New("the bearer token is not known")
)

// authenticate returns the token entry of a request's bearer token.
func (t Tokens) authenticate(r *http.Request) (*Token, error) {
	h := r.Header.Get("Authorization")
	scheme, token, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || token == "" {
		return nil, errNoToken
	}
	return t.Lookup(token)
}

// Lookup returns the entry of a bearer token. Every entry is compared (in
// constant time), so timing tells nothing about which hash is near.
func (t Tokens) Lookup(token string) (*Token, error) {
	sum := sha256.Sum256([]byte(strings.TrimSpace(token)))
	var found *Token
	for i := range t.Tokens {
		want, _ := hex.DecodeString(t.Tokens[i].SHA256)
		if subtle.ConstantTimeCompare(sum[:], want) == 1 {
			found = &t.Tokens[i]
		}
	}
	if found == nil {
		return nil, errBadToken
	}
	return found, nil
}

// Principal is the token's user and grants as a run's principal, signed
// with a gateway's key (keyID, key); nil without a key, so that the run
// holds what the policy grants the tenant's NATS clients.
func (t *Token) Principal(keyID string, key []byte) *client.Principal {
	if len(key) == 0 {
		return nil
	}
	return &client.Principal{User: t.User, Roles: t.Grants.Roles, Scopes: t.Grants.Scopes, KeyID: keyID, Key: key}
}

// May reports whether the token holds role; run and approve include read.
func (t *Token) May(role string) bool {
	if role == RoleRead {
		return len(t.Roles) > 0
	}
	return slices.Contains(t.Roles, role)
}
