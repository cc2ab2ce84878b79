package policy

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

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

// Key is one approval key: its secret and who holds it.
type Key struct {
	// Secret is the HMAC-SHA256 key, at least 16 bytes.
	Secret []byte
	// Holder is the user the key authenticates as approver; empty means a
	// user of the key id's name.
	Holder string
	// Gateway marks the key of a service that authenticates its own users
	// (the HTTP API, the console): its tokens sign the approver's name
	// along with the context, and must name one.
	Gateway bool
}

// Keys are the approval keys, by key id. Several keys can be valid at
// once, so keys rotate without invalidating pending approvals signed with
// the previous key. Each approver holds a key of their own: the key id
// names who approved, never a name the approver typed.
type Keys map[string]Key

// holder is who a key authenticates.
func (k Key) holder(kid string) string {
	if k.Holder != "" {
		return k.Holder
	}
	return kid
}

// ParseKeys reads comma-separated keys "kid:base64secret" (held by the
// user named kid), "kid:base64secret:user" (held by user) or
// "kid:base64secret:*" (a gateway's key, which names the approver it
// authenticated); secrets in standard or URL base64. An empty string gives
// no keys.
func ParseKeys(s string) (Keys, error) {
	k := Keys{}
	for i, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		// An error names the key by position, never by content: a
		// malformed entry may be nothing but the secret.
		id, rest, ok := strings.Cut(part, ":")
		if !ok || id == "" || strings.ContainsAny(id, ". ") {
			return nil, fmt.Errorf("policy: approval key %d: want kid:base64secret[:holder] (a key id without dots or spaces)", i+1)
		}
		secret, holder, _ := strings.Cut(rest, ":")
		raw, err := base64.StdEncoding.DecodeString(secret)
		if err != nil {
			if raw, err = base64.RawURLEncoding.DecodeString(secret); err != nil {
				return nil, fmt.Errorf("policy: approval key %s: secret is not base64", id)
			}
		}
		if len(raw) < 16 {
			return nil, fmt.Errorf("policy: approval key %s: secret must be at least 16 bytes", id)
		}
		key := Key{Secret: raw}
		switch {
		case holder == "*":
			key.Gateway = true
		case holder != "" && !ValidApprover(holder):
			return nil, fmt.Errorf("policy: approval key %s: holder %q is not a user name", id, holder)
		default:
			key.Holder = holder
		}
		k[id] = key
	}
	return k, nil
}

// ValidApprover reports whether a name can name an approver: 1 to 128
// bytes of visible characters — no spaces of any kind, no format
// characters (zero-width, bidirectional overrides), no separators — and no
// dot at either end: a name that renders blank or as another is refused.
func ValidApprover(name string) bool {
	if name == "" || len(name) > 128 || strings.Trim(name, ".") != name || !utf8.ValidString(name) {
		return false
	}
	for _, r := range name {
		if !unicode.IsGraphic(r) || unicode.IsSpace(r) || unicode.In(r, unicode.Cf, unicode.Zs, unicode.Zl, unicode.Zp) ||
			strings.ContainsRune(":,/\\", r) {
			return false
		}
	}
	return true
}

// Sign returns the token of a context signed with an approver's own key:
// "<kid>.<base64url HMAC-SHA256 of the canonical context>".
func Sign(kid string, key []byte, c ApprovalContext) (string, error) {
	canon, err := c.canonical()
	if err != nil {
		return "", err
	}
	return mac(kid, key, canon), nil
}

// SignAs returns the token a gateway signs for the approver it
// authenticated: the HMAC covers the canonical context with the field
// "approver" added.
func SignAs(kid string, key []byte, c ApprovalContext, approver string) (string, error) {
	c.ExpiresAt = c.ExpiresAt.UTC().Truncate(time.Second)
	canon, err := canonical.Marshal(struct {
		ApprovalContext
		Approver string `json:"approver"`
	}{c, approver})
	if err != nil {
		return "", err
	}
	return mac(kid, key, canon), nil
}

func mac(kid string, key, msg []byte) string {
	m := hmac.New(sha256.New, key)
	m.Write(msg)
	return kid + "." + base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// Verify checks a grant's token against the stored context and returns
// the approver it authenticates. The key id must be known and the
// signature must match the context exactly; the context must not have
// expired. An approver's own key approves as its holder (a grant naming
// someone else is refused); a gateway's key must name its approver, whose
// name it signed. Errors are *actionbus.Error with code approval_invalid
// or approval_expired.
func (k Keys) Verify(token string, c ApprovalContext, claimed string, now time.Time) (string, error) {
	approver, err := k.answerer(token, claimed, func(kid string, key []byte, gateway bool) (string, error) {
		if gateway {
			return SignAs(kid, key, c, claimed)
		}
		return Sign(kid, key, c)
	})
	if err != nil {
		return "", err
	}
	if !now.Before(c.ExpiresAt) {
		return "", actionbus.Errorf(actionbus.CodeApprovalExpired, "approval expired at %s", c.ExpiresAt.UTC().Format(time.RFC3339))
	}
	return approver, nil
}

// denial is what a denial's token signs.
type denial struct {
	ApprovalID string `json:"approvalId"`
	Outcome    string `json:"outcome"`
	Reason     string `json:"reason"`
	Approver   string `json:"approver,omitempty"`
}

// SignDenial returns the token of a denial with an approver's own key:
// "<kid>.<base64url HMAC-SHA256 of the RFC 8785 form of {approvalId,
// outcome: "denied", reason}>".
func SignDenial(kid string, key []byte, approvalID, reason string) (string, error) {
	return signDenial(kid, key, denial{ApprovalID: approvalID, Outcome: "denied", Reason: reason})
}

// SignDenialAs is SignDenial for a gateway's key: the signed object also
// holds "approver", the user the gateway authenticated.
func SignDenialAs(kid string, key []byte, approvalID, reason, approver string) (string, error) {
	return signDenial(kid, key, denial{ApprovalID: approvalID, Outcome: "denied", Reason: reason, Approver: approver})
}

func signDenial(kid string, key []byte, d denial) (string, error) {
	canon, err := canonical.Marshal(d)
	if err != nil {
		return "", err
	}
	return mac(kid, key, canon), nil
}

// VerifyDenial checks a denial's token and returns the approver it
// authenticates, by the rules of Verify.
func (k Keys) VerifyDenial(token, approvalID, reason, claimed string) (string, error) {
	return k.answerer(token, claimed, func(kid string, key []byte, gateway bool) (string, error) {
		if gateway {
			return SignDenialAs(kid, key, approvalID, reason, claimed)
		}
		return SignDenial(kid, key, approvalID, reason)
	})
}

// answerer authenticates who signed an answer's token: sign recomputes the
// token the key would give. An approver's own key answers as its holder
// (an answer naming someone else is refused); a gateway's key must name
// the user it authenticated, whose name it signed.
func (k Keys) answerer(token, claimed string, sign func(kid string, key []byte, gateway bool) (string, error)) (string, error) {
	kid, _, ok := strings.Cut(token, ".")
	if !ok {
		return "", actionbus.Errorf(actionbus.CodeApprovalInvalid, "malformed approval token")
	}
	key, known := k[kid]
	if !known {
		return "", actionbus.Errorf(actionbus.CodeApprovalInvalid, "approval token signed with unknown key %q", kid)
	}
	approver := key.holder(kid)
	switch {
	case key.Gateway:
		if !ValidApprover(claimed) {
			return "", actionbus.Errorf(actionbus.CodeApprovalInvalid, "approval key %q is a gateway's: its answer must name the approver it authenticated", kid)
		}
		approver = claimed
	case claimed != "" && claimed != approver && claimed != kid:
		return "", actionbus.Errorf(actionbus.CodeApprovalInvalid, "the answer names %q but approval key %q is held by %q", claimed, kid, approver)
	}
	want, err := sign(kid, key.Secret, key.Gateway)
	if err != nil {
		return "", err
	}
	if !hmac.Equal([]byte(want), []byte(token)) {
		return "", actionbus.Errorf(actionbus.CodeApprovalInvalid,
			"approval token does not verify with key %q: signed with another secret, or over something other than what it answers", kid).
			WithDetail(MismatchDetail, MismatchSignature)
	}
	return approver, nil
}

// MismatchDetail is the detail of an approval_invalid error whose token
// did not verify; its value says why, as far as is known:
// [MismatchSignature] (a wrong secret, or another context: the verifier
// cannot tell them apart), [MismatchBadSignature] (the token was signed
// over the very context stored: its secret is wrong) or
// [MismatchContext] (the token verifies over another context).
const MismatchDetail = "mismatch"

// Values of [MismatchDetail].
const (
	MismatchSignature    = "signature"
	MismatchBadSignature = "bad_signature"
	MismatchContext      = "context"
)

// ContextDiff returns the names (as signed, in JSON) of the fields in
// which two approval contexts differ as a token signs them (the expiry to
// the second), in the signed order; none when a token over one verifies
// over the other.
func ContextDiff(a, b ApprovalContext) []string {
	ca, errA := a.canonical()
	cb, errB := b.canonical()
	if errA != nil || errB != nil {
		return []string{"(unreadable)"}
	}
	var fa, fb map[string]json.RawMessage
	if json.Unmarshal(ca, &fa) != nil || json.Unmarshal(cb, &fb) != nil {
		return []string{"(unreadable)"}
	}
	names := map[string]bool{}
	for k := range fa {
		names[k] = true
	}
	for k := range fb {
		names[k] = true
	}
	var out []string
	for k := range names {
		if string(fa[k]) != string(fb[k]) {
			out = append(out, k)
		}
	}
	sort.Strings(out)
	return out
}

// PrincipalClaim is what a gateway signs for the user it authenticated
// when it requests a run: the run, the user, the user's grants and until
// when the statement holds. The expiry is what keeps a statement from being
// replayed once the run's state is gone (runs are kept far longer than a
// statement lives, and a run id already stored is never started again).
type PrincipalClaim struct {
	RunID     string    `json:"runId"`
	Tenant    string    `json:"tenant"`
	User      string    `json:"user"`
	Roles     []string  `json:"roles"`
	Scopes    []string  `json:"scopes"`
	ExpiresAt time.Time `json:"expiresAt"`
}

// PrincipalTTL is how long a gateway's statement of a run's principal
// holds: a request the dispatcher first reads later fails unauthenticated.
const PrincipalTTL = time.Hour

// SignPrincipal returns a gateway's token for a claim:
// "<kid>.<base64url HMAC-SHA256 of the claim's RFC 8785 form>", with nil
// role and scope lists signed as empty ones and the expiry in UTC RFC 3339
// (seconds).
func SignPrincipal(kid string, key []byte, c PrincipalClaim) (string, error) {
	c.ExpiresAt = c.ExpiresAt.UTC().Truncate(time.Second)
	if c.Roles == nil {
		c.Roles = []string{}
	}
	if c.Scopes == nil {
		c.Scopes = []string{}
	}
	canon, err := canonical.Marshal(c)
	if err != nil {
		return "", err
	}
	return mac(kid, key, canon), nil
}

// VerifyPrincipal checks a gateway's token for a claim at time now and
// returns the principal it authenticates. Only a gateway's key signs
// principals (an approver's own key cannot), and an expired statement is
// refused; errors are *actionbus.Error with code unauthenticated.
func (k Keys) VerifyPrincipal(token string, c PrincipalClaim, now time.Time) (Principal, error) {
	kid, _, _ := strings.Cut(token, ".")
	key, known := k[kid]
	if !known || !key.Gateway {
		return Principal{}, actionbus.Errorf(actionbus.CodeUnauthenticated, "a run's principal must be signed by a gateway's key; %q is not one", kid)
	}
	if !ValidApprover(c.User) {
		return Principal{}, actionbus.Errorf(actionbus.CodeUnauthenticated, "a run's principal names no valid user")
	}
	want, err := SignPrincipal(kid, key.Secret, c)
	if err != nil {
		return Principal{}, err
	}
	if !hmac.Equal([]byte(want), []byte(token)) {
		return Principal{}, actionbus.Errorf(actionbus.CodeUnauthenticated, "the run's principal does not match its gateway's signature")
	}
	if !now.Before(c.ExpiresAt) {
		return Principal{}, actionbus.Errorf(actionbus.CodeUnauthenticated, "the run's principal expired at %s", c.ExpiresAt.UTC().Format(time.RFC3339))
	}
	return Principal{Tenant: c.Tenant, Gateway: kid, User: c.User, Grants: Grants{Roles: c.Roles, Scopes: c.Scopes}}, nil
}
