package accounts_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"

	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/accounts"
)

// A tenant imports exactly what ACTIONBUS exports, with the tenant
// position (the token after "run", "api", "stream", "audit") filled in,
// and nothing naming another tenant.
func TestTenantImportsAreTheExportsWithTheTenantFilledIn(t *testing.T) {
	exports := accounts.Exports("ab")
	imports := accounts.Imports("ab", "acme")
	if len(exports) != len(imports) || len(exports) == 0 {
		t.Fatalf("%d exports, %d imports", len(exports), len(imports))
	}
	want := map[string]jwt.ExportType{
		"ab.run.*.*.requested": jwt.Service, "ab.run.*.*.cancel": jwt.Service, "ab.run.*.*.input": jwt.Service,
		"ab.run.*.*.approve": jwt.Service, "ab.run.*.*.deny": jwt.Service, "ab.api.*.>": jwt.Service,
		"ab.run.*.*.*": jwt.Stream, "ab.stream.*.*": jwt.Stream, "ab.audit.*.*.*": jwt.Stream,
		"ab.run.*.*.decision": jwt.Stream, "ab.run.*.*.synthesized": jwt.Stream, "ab.run.*.*.result": jwt.Stream,
	}
	for i, e := range exports {
		if k, ok := want[e.Subject]; !ok || k != e.Kind {
			t.Errorf("export %s (%v) not in the layout", e.Subject, e.Kind)
		}
		tokens := strings.Split(e.Subject, ".")
		tokens[2] = "acme"
		if imports[i].Subject != strings.Join(tokens, ".") || imports[i].Kind != e.Kind {
			t.Errorf("import %s of export %s", imports[i].Subject, e.Subject)
		}
		if !jwt.Subject(imports[i].Subject).IsContainedIn(jwt.Subject(e.Subject)) {
			t.Errorf("import %s is not inside export %s", imports[i].Subject, e.Subject)
		}
	}
	if len(want) != len(exports) {
		t.Errorf("%d exports, the layout has %d", len(exports), len(want))
	}
	// Timers (6 tokens) never leave ACTIONBUS.
	for _, e := range exports {
		if jwt.Subject("ab.run.acme.R.sched.k").IsContainedIn(jwt.Subject(e.Subject)) {
			t.Errorf("export %s carries timers", e.Subject)
		}
	}
}

// A tenant account's claims: named after the tenant, JetStream disabled,
// the limits (defaults documented), every import token-activated by
// ACTIONBUS for this account and a subject inside the tenant's own.
func TestTenantAccountClaims(t *testing.T) {
	svc, _ := nkeys.CreateAccount()
	svcPub, _ := svc.PublicKey()
	planner, _ := nkeys.CreateAccount()
	auditor, _ := nkeys.CreateAccount()
	pool, _ := nkeys.CreateAccount()
	exporters := accounts.Exporters{accounts.ServiceAccount: svc, accounts.PlannerAccount: planner, accounts.AuditorAccount: auditor,
		accounts.PoolAccount("default"): pool}
	pubOf := map[string]string{}
	for name, kp := range exporters {
		pubOf[name], _ = kp.PublicKey()
	}
	tkp, _ := nkeys.CreateAccount()
	tpub, _ := tkp.PublicKey()
	ac, err := accounts.TenantAccountClaims("ab", "acme", tpub, exporters, accounts.Limits{MaxConnections: 5})
	if err != nil {
		t.Fatal(err)
	}
	if ac.Name != "acme" || ac.Limits.IsJSEnabled() {
		t.Fatalf("name %s, JetStream enabled %v", ac.Name, ac.Limits.IsJSEnabled())
	}
	if ac.Limits.Conn != 5 || ac.Limits.Subs != accounts.DefaultMaxSubscriptions || ac.Limits.Payload != accounts.DefaultMaxPayload || ac.Limits.LeafNodeConn != 0 {
		t.Fatalf("limits %+v", ac.Limits)
	}
	if len(ac.Imports) != len(accounts.Exports("ab")) {
		t.Fatalf("%d imports", len(ac.Imports))
	}
	from := map[string]string{}
	for _, c := range accounts.Imports("ab", "acme") {
		from[c.Subject] = c.From
	}
	for _, im := range ac.Imports {
		exporter := from[string(im.Subject)]
		if exporter == "" {
			exporter = accounts.ServiceAccount
		}
		want := pubOf[exporter]
		if im.Account != want || im.LocalSubject != "" || !strings.HasPrefix(string(im.Subject), "ab.") || strings.Split(string(im.Subject), ".")[2] != "acme" {
			t.Errorf("import %+v", im)
		}
		act, err := jwt.DecodeActivationClaims(im.Token)
		if err != nil {
			t.Fatalf("import %s: %v", im.Subject, err)
		}
		if act.Issuer != want || act.Subject != tpub || act.ImportSubject != im.Subject || act.ImportType != im.Type {
			t.Errorf("activation of %s: issuer %s subject %s import %s", im.Subject, act.Issuer, act.Subject, act.ImportSubject)
		}
	}
	vr := jwt.CreateValidationResults()
	ac.Validate(vr)
	if vr.IsBlocking(true) {
		t.Fatalf("claims invalid: %v", vr.Errors())
	}
	sc := accounts.ServiceAccountClaims(svcPub, "ab", "default", "gpu")
	var own int
	for _, c := range accounts.Exports("ab", "default", "gpu") {
		if c.From == "" {
			own++
		}
	}
	if !sc.Limits.IsJSEnabled() || len(sc.Exports) != own+len(accounts.OwnExports("default", "gpu")) {
		t.Fatal("ACTIONBUS: JetStream or exports missing")
	}
	for _, e := range sc.Exports {
		if !e.TokenReq {
			t.Errorf("export %s is public", e.Subject)
		}
	}
}

// The tenant users' lists name only their own tenant's subjects and
// inbox; the approver cannot start runs, the client cannot approve.
func TestTenantUsersNameOnlyTheirTenant(t *testing.T) {
	for _, u := range accounts.TenantUsers("ab", "acme") {
		for _, s := range append(slices.Clone(u.Permissions.Pub), u.Permissions.Sub...) {
			tok := strings.Split(s, ".")
			if !(len(tok) > 2 && tok[2] == "acme") && s != "_INBOX_acme.>" {
				t.Errorf("%s may use %s", u.Name, s)
			}
		}
	}
	c, a := accounts.ClientPermissions("ab", "acme"), accounts.ApproverPermissions("ab", "acme")
	if slices.Contains(c.Pub, "ab.run.acme.*.approve") || slices.Contains(a.Pub, "ab.run.acme.*.requested") {
		t.Error("client approves or approver requests")
	}
	if accounts.ClientUser(events.DefaultTenant) != "client" || accounts.ClientUser("acme") != "client-acme" || accounts.ApproverUser("acme") != "approver-acme" {
		t.Error("user names")
	}
}

// The service users of operator mode: admin unrestricted, one executor
// user per pool with its pool's grants, every service receiving only on
// its own inbox.
func TestServiceUsers(t *testing.T) {
	users := accounts.ServiceUsers("default", "billing")
	names := map[string]accounts.Permissions{}
	for _, u := range accounts.AllServiceUsers("default", "billing") {
		names[u.Name] = u.Permissions
	}
	for _, u := range users {
		if u.Name != "admin" && u.Name != "dispatcher" {
			t.Errorf("%s is a user of ACTIONBUS, not of an account of its own", u.Name)
		}
	}
	for _, n := range []string{"admin", "dispatcher", "planner", "auditor", "executor", "executor-billing"} {
		if _, ok := names[n]; !ok {
			t.Errorf("no user %s", n)
		}
	}
	if p := names["admin"]; len(p.Pub)+len(p.Sub) != 0 {
		t.Error("admin is restricted")
	}
	b := names["executor-billing"]
	if !slices.Contains(b.Pub, "ab.pool.billing.announce") || !slices.Contains(b.Pub, "$KV.ab_idempotency_billing.>") ||
		slices.Contains(b.Pub, "$KV.ab_idempotency_default.>") || !slices.Contains(b.Pub, "$JS.API.CONSUMER.MSG.NEXT.AB_WORK.pool-billing") {
		t.Errorf("executor-billing: %v", b.Pub)
	}
	for _, s := range b.Pub {
		if strings.Contains(s, "ab_catalog") || strings.Contains(s, "ab_limits") {
			t.Errorf("executor-billing writes a shared store: %s", s)
		}
	}
	if d := names["dispatcher"]; !slices.Contains(d.Pub, "$JS.API.STREAM.MSG.GET.OBJ_ab_artifacts_billing") || !d.AllowResponses {
		t.Errorf("dispatcher: reads every pool's artifacts and answers requests: %+v", d)
	}
	for n, p := range names {
		for _, s := range p.Pub {
			if strings.Contains(s, "{pool}") {
				t.Errorf("%s: unrendered %s", n, s)
			}
		}
		for _, s := range p.Sub {
			if strings.HasPrefix(s, "_INBOX") && !strings.HasPrefix(s, "_INBOX_"+strings.SplitN(n, "-", 2)[0]+".") {
				t.Errorf("%s receives on %s", n, s)
			}
		}
	}
}
