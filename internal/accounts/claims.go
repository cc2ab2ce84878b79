package accounts

import (
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"
)

// OperatorClaims returns the operator JWT of name, self-signed by kp,
// naming sysPub as its system account.
func OperatorClaims(name string, kp nkeys.KeyPair, sysPub string) (string, error) {
	pub, err := kp.PublicKey()
	if err != nil {
		return "", err
	}
	oc := jwt.NewOperatorClaims(pub)
	oc.Name = name
	oc.SystemAccount = sysPub
	return oc.Encode(kp)
}

// SystemAccountClaims returns the system account's claims (no
// JetStream, no limits).
func SystemAccountClaims(pub string) *jwt.AccountClaims {
	ac := jwt.NewAccountClaims(pub)
	ac.Name = SystemAccount
	return ac
}

// ServiceAccountClaims returns the claims of the ACTIONBUS account:
// JetStream enabled without limits (the deployment bounds the server),
// and [Exports] as token-required exports.
//
// Why token-required: only the operator signs account JWTs, so public
// exports would already keep a tenant to the imports the operator gave
// it. Requiring an activation token, which ACTIONBUS's own key signs for
// one tenant account and that tenant's subjects only ([Activation]),
// makes the tenant token a second signed fact: an account JWT signed by
// mistake (or by a script holding only the operator key) with an import
// naming another tenant's subjects is refused by the server, with a
// borrowed token as a whole (account_refused) and without one import by
// import (TestAnImportOfAnotherTenantsSubjectsWithoutItsActivationIsRefused).
// Verified on nats-server 2.15.2: a narrowed token activates a wildcard
// service import, and JetStream publish acks come back through it.
//
// The exports to accounts of their own ([OwnExports]) are token-required
// the same way ([OwnAccountClaims]).
func ServiceAccountClaims(pub, prefix string, pools ...string) *jwt.AccountClaims {
	ac := jwt.NewAccountClaims(pub)
	ac.Name = ServiceAccount
	ac.Limits.JetStreamLimits = jwt.JetStreamLimits{MemoryStorage: jwt.NoLimit, DiskStorage: jwt.NoLimit,
		Streams: jwt.NoLimit, Consumer: jwt.NoLimit, MaxAckPending: jwt.NoLimit}
	addTenantExports(ac, prefix, ServiceAccount, pools)
	for _, e := range OwnExports(pools...) {
		ac.Exports.Add(&jwt.Export{Name: e.Subject, Subject: jwt.Subject(e.Subject), Type: e.Kind, TokenReq: true,
			ResponseType: e.Response})
	}
	return ac
}

// addTenantExports adds account's exports to tenants ([Exports] from it),
// token-required.
func addTenantExports(ac *jwt.AccountClaims, prefix, account string, pools []string) {
	for _, c := range Exports(prefix, pools...) {
		if c.exporter() == account {
			ac.Exports.Add(&jwt.Export{Name: c.Subject, Subject: jwt.Subject(c.Subject), Type: c.Kind, TokenReq: true})
		}
	}
}

// OwnAccountClaims returns the claims of the account of its own a
// (public key pub): JetStream disabled, a's crossings imported from
// ACTIONBUS (service) with activation tokens signed by service, and its
// exports to tenants ([Crossing.From]), token-required.
func OwnAccountClaims(a OwnAccount, pub, prefix string, service nkeys.KeyPair) (*jwt.AccountClaims, error) {
	servicePub, err := service.PublicKey()
	if err != nil {
		return nil, err
	}
	ac := jwt.NewAccountClaims(pub)
	ac.Name = a.Name
	ac.Limits.JetStreamLimits = jwt.JetStreamLimits{}
	var pools []string
	if pool, ok := strings.CutPrefix(a.Name, "POOL_"); ok {
		pools = []string{pool}
	}
	addTenantExports(ac, prefix, a.Name, pools)
	if len(ac.Exports) == 0 {
		ac.Limits.Exports = 0
	}
	for _, c := range a.Crossings {
		tok, err := Activation(service, pub, c)
		if err != nil {
			return nil, err
		}
		ac.Imports.Add(&jwt.Import{Name: c.Subject, Subject: jwt.Subject(c.Subject), LocalSubject: jwt.RenamingSubject(c.Local),
			Account: servicePub, Token: tok, Type: c.Kind})
	}
	return ac, nil
}

// Activation returns the activation token by which ACTIONBUS (service,
// its key pair) lets tenantPub import exactly c.
func Activation(service nkeys.KeyPair, tenantPub string, c Crossing) (string, error) {
	act := jwt.NewActivationClaims(tenantPub)
	act.Name = c.Subject
	act.ImportSubject = jwt.Subject(c.Subject)
	act.ImportType = c.Kind
	return act.Encode(service)
}

// Exporters are the key pairs of the accounts a tenant imports from, by
// account name: ACTIONBUS, PLANNER, AUDITOR and the pools' ([Crossing.From]).
type Exporters map[string]nkeys.KeyPair

// TenantAccountClaims returns the claims of tenant's account (public key
// tenantPub): named after the tenant, JetStream disabled, limits l (with
// defaults), and [Imports] from the accounts that export them, with
// activation tokens signed by each one's key pair in exporters.
func TenantAccountClaims(prefix, tenant, tenantPub string, exporters Exporters, l Limits, pools ...string) (*jwt.AccountClaims, error) {
	l = l.WithDefaults()
	ac := jwt.NewAccountClaims(tenantPub)
	ac.Name = tenant
	// JetStream disabled: zero storage (the default) is "not enabled".
	ac.Limits.JetStreamLimits = jwt.JetStreamLimits{}
	ac.Limits.Conn = l.MaxConnections
	ac.Limits.LeafNodeConn = 0
	ac.Limits.Subs = l.MaxSubscriptions
	ac.Limits.Payload = l.MaxPayload
	ac.Limits.Exports = 0
	for _, c := range Imports(prefix, tenant, pools...) {
		kp, ok := exporters[c.exporter()]
		if !ok {
			return nil, fmt.Errorf("accounts: no key of %s, which exports %s", c.exporter(), c.Subject)
		}
		exporterPub, err := kp.PublicKey()
		if err != nil {
			return nil, err
		}
		tok, err := Activation(kp, tenantPub, c)
		if err != nil {
			return nil, err
		}
		ac.Imports.Add(&jwt.Import{Name: c.Subject, Subject: jwt.Subject(c.Subject), Account: exporterPub, Token: tok, Type: c.Kind})
	}
	return ac, nil
}

// RevokedTenantClaims returns tenant's account claims as [tenant remove]
// pushes them: no imports, no connections, and every user issued up to
// now revoked, so that the server closes their connections and refuses
// them again.
func RevokedTenantClaims(tenant, tenantPub string, now time.Time) *jwt.AccountClaims {
	ac := jwt.NewAccountClaims(tenantPub)
	ac.Name = tenant
	ac.Limits.JetStreamLimits = jwt.JetStreamLimits{}
	ac.Limits.Conn = 0
	ac.Limits.LeafNodeConn = 0
	ac.Revocations = jwt.RevocationList{}
	ac.Revocations.Revoke(jwt.All, now)
	return ac
}

// UserClaims returns the JWT of user u (public key userPub) of the
// account whose key pair is account, with reply inbox allowed as the
// permissions say.
func UserClaims(u User, userPub string, account nkeys.KeyPair) (string, error) {
	uc := jwt.NewUserClaims(userPub)
	uc.Name = u.Name
	uc.Permissions.Pub.Allow = jwt.StringList(u.Permissions.Pub)
	uc.Permissions.Sub.Allow = jwt.StringList(u.Permissions.Sub)
	if u.Permissions.AllowResponses {
		uc.Permissions.Resp = &jwt.ResponsePermission{MaxMsgs: 1}
	}
	return uc.Encode(account)
}

// Creds returns the credentials file text of a new user u of account:
// its JWT and its seed.
func Creds(u User, account nkeys.KeyPair) ([]byte, string, error) {
	ukp, err := nkeys.CreateUser()
	if err != nil {
		return nil, "", err
	}
	pub, err := ukp.PublicKey()
	if err != nil {
		return nil, "", err
	}
	seed, err := ukp.Seed()
	if err != nil {
		return nil, "", err
	}
	tok, err := UserClaims(u, pub, account)
	if err != nil {
		return nil, "", err
	}
	creds, err := jwt.FormatUserConfig(tok, seed)
	if err != nil {
		return nil, "", fmt.Errorf("accounts: creds of %s: %w", u.Name, err)
	}
	return creds, pub, nil
}

// DeleteClaims returns the operator-signed request that deletes the
// accounts pubs from a full resolver that allows deletion
// ($SYS.REQ.CLAIMS.DELETE).
func DeleteClaims(operator nkeys.KeyPair, pubs ...string) (string, error) {
	opub, err := operator.PublicKey()
	if err != nil {
		return "", err
	}
	gc := jwt.NewGenericClaims(opub)
	gc.Data["accounts"] = pubs
	return gc.Encode(operator)
}
