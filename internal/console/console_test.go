package console_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/browser"
	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/executor"
	"github.com/actionbus/actionbus/internal/console"
	"github.com/actionbus/actionbus/internal/httpapi"
)

var approvalKey = []byte("0123456789abcdef0123456789abcdef")

type skuIn struct {
	SKU string `json:"sku"`
}

// fanOut is how many calls of inv.count the waterfall test runs at once.
const fanOut = 10

// countTakes is how long a call of inv.count works once its batch is
// together.
const countTakes = 20 * time.Millisecond

// together holds the calls of inv.count in batches of fanOut, each call
// until its batch runs at once (or, should it never, for at most ten
// seconds): met says how many batches did.
type together struct {
	mu      sync.Mutex
	n, full int
	all     chan struct{}
}

func (g *together) met() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.full
}

func (g *together) wait(ctx context.Context) error {
	g.mu.Lock()
	all := g.all
	g.n++
	if g.n%fanOut == 0 {
		close(all)
		g.all, g.full = make(chan struct{}), g.full+1
	}
	g.mu.Unlock()
	select {
	case <-all:
	case <-time.After(10 * time.Second):
	case <-ctx.Done():
		return ctx.Err()
	}
	return nil
}

// register registers the test's actions; the calls of inv.count on
// every executor meet at g.
func register(g *together) func(*executor.Executor) error {
	return func(ex *executor.Executor) error {
		if err := executor.Register(ex, executor.Action{Name: "inv.count", Description: "Count a SKU's units."},
			func(ctx context.Context, in skuIn, _ executor.Call) (executor.Result[map[string]any], error) {
				if err := g.wait(ctx); err != nil {
					return executor.Result[map[string]any]{}, err
				}
				// Counting takes a moment once the batch is together: the
				// call that completes the batch would otherwise take no
				// time at all, and a bar of zero length overlaps nothing.
				select {
				case <-time.After(countTakes):
				case <-ctx.Done():
					return executor.Result[map[string]any]{}, ctx.Err()
				}
				return executor.Result[map[string]any]{Output: map[string]any{"sku": in.SKU, "counted": 12}}, nil
			}); err != nil {
			return err
		}
		if err := executor.Register(ex, executor.Action{Name: "inv.flaky", Description: "Fails its first attempt."},
			func(_ context.Context, in skuIn, call executor.Call) (executor.Result[map[string]any], error) {
				if call.Attempt == 1 {
					return executor.Result[map[string]any]{}, errors.New("the first attempt fails")
				}
				return executor.Result[map[string]any]{Output: map[string]any{"sku": in.SKU}}, nil
			}); err != nil {
			return err
		}
		return registerInventory(ex)
	}
}

// registerInventory registers inv.stock (a read) and inv.reorder (a
// mutation, tier 2: it needs an approval).
func registerInventory(ex *executor.Executor) error {
	if err := executor.Register(ex, executor.Action{Name: "inv.stock", Description: "Units available for a SKU."},
		func(_ context.Context, in skuIn, _ executor.Call) (executor.Result[map[string]any], error) {
			return executor.Result[map[string]any]{Output: map[string]any{"sku": in.SKU, "available": 12}, Summary: "12 available"}, nil
		}); err != nil {
		return err
	}
	return executor.Register(ex, executor.Action{Name: "inv.reorder", Description: "Reorder a SKU.", Mode: executor.ModeMutate, Tier: 2},
		func(_ context.Context, in skuIn, _ executor.Call) (executor.Result[map[string]any], error) {
			return executor.Result[map[string]any]{Output: map[string]any{"reordered": in.SKU}}, nil
		})
}

// scenarios holds plan10: a clarify question, then a plan of ten calls.
var scenarios = `
scenarios:
  plan10:
    decisions:
      - {type: clarify, question: 'Which warehouse?'}
      - type: plan
        actions: [` + strings.TrimSuffix(strings.Repeat("{type: action, name: inv.count, args: {sku: P-1}}, ", fanOut), ", ") + `]
      - {type: final, answer: '{{ len .Last }} counted'}
`

// serve starts a stack (two executors; a plan or workflow runs ten calls
// at once) and the console with its API over it, connected as the
// deployed client and approver users, and returns the console's URL, a
// token holding every role, the client (to read runs' events) and where
// the calls of inv.count meet.
func serve(t *testing.T) (string, string, *client.Client, *together) {
	t.Helper()
	g := &together{all: make(chan struct{})}
	srv := actionbustest.NewServer(t, actionbustest.Options{Users: true})
	srv.StartStack(t, actionbustest.StackOptions{Register: register(g), Executors: 2, Limits: events.RunLimits{MaxPlanParallel: fanOut}, Scenarios: scenarios,
		ApprovalKeys: "k1:" + base64.StdEncoding.EncodeToString(approvalKey) + ":*"})
	c, err := client.New(srv.TenantConnect(t, "client", "default"), client.Options{})
	require.NoError(t, err)
	ap, err := client.New(srv.TenantConnect(t, "approver", "default"), client.Options{})
	require.NoError(t, err)
	token, entry, err := httpapi.NewToken("operator", httpapi.RoleRun, httpapi.RoleApprove)
	require.NoError(t, err)
	api, err := httpapi.New(httpapi.Config{Client: c, Approver: ap, ApprovalKeyID: "k1", ApprovalKey: approvalKey,
		Tokens: httpapi.Tokens{Tokens: []httpapi.Token{entry}}})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = api.Run(ctx) }()
	hs := httptest.NewServer(console.Mount(api.Handler(), console.Options{Tenant: api.Tenant()}))
	t.Cleanup(func() { hs.Close(); cancel(); <-done })
	return hs.URL, token, c, g
}

func TestThePageHoldsNoDataAndForbidsForeignScripts(t *testing.T) {
	url, _, _, _ := serve(t)
	res, err := http.Get(url + "/")
	require.NoError(t, err)
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	assert.Equal(t, http.StatusOK, res.StatusCode)
	csp := res.Header.Get("Content-Security-Policy")
	assert.Contains(t, csp, "default-src 'self'")
	assert.NotContains(t, csp, "script-src", "scripts fall back to default-src 'self': none from elsewhere")
	assert.NotContains(t, csp, "data:")
	assert.NotContains(t, csp, "*")
	assert.Contains(t, string(body), `<b id="tenant">default</b>`)
	assert.Contains(t, string(body), `/static/console.js`)
	// The favicon is the console's own file, which default-src 'self' allows.
	assert.Contains(t, string(body), `<link rel="icon" type="image/svg+xml" href="/static/favicon.svg">`)
	res, err = http.Get(url + "/static/favicon.svg")
	require.NoError(t, err)
	res.Body.Close()
	assert.Equal(t, http.StatusOK, res.StatusCode)
	assert.Equal(t, "image/svg+xml", res.Header.Get("Content-Type"))
	res, err = http.Get(url + "/static/console.js")
	require.NoError(t, err)
	res.Body.Close()
	assert.Equal(t, http.StatusOK, res.StatusCode)
	// The data is the API's, behind the token.
	res, err = http.Get(url + "/v1/runs")
	require.NoError(t, err)
	res.Body.Close()
	assert.Equal(t, http.StatusUnauthorized, res.StatusCode)
}

// chromium finds Debian's chromium (installed by .ci/run).
// apiGet reads an API path as the token's user.
func apiGet(t *testing.T, url, token, path string) map[string]any {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url+path, nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+token)
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	var out map[string]any
	require.NoError(t, json.NewDecoder(res.Body).Decode(&out))
	return out
}

// apiPost posts body (JSON) to an API path as the token's user.
func apiPost(t *testing.T, url, token, path string, body any) map[string]any {
	t.Helper()
	b, err := json.Marshal(body)
	require.NoError(t, err)
	req, err := http.NewRequest(http.MethodPost, url+path, strings.NewReader(string(b)))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	var out map[string]any
	require.NoError(t, json.NewDecoder(res.Body).Decode(&out))
	require.Less(t, res.StatusCode, 300, "POST %s: %v", path, out)
	return out
}

// artifacts returns where the test's screenshots go: the directory
// ACTIONBUS_ARTIFACTS names (kept after the test), else the test's
// artifact directory (go test -artifacts keeps it under the output
// directory; otherwise it is temporary). With ACTIONBUS_ARTIFACTS set,
// each screenshot is written to the artifact directory too.
func artifacts(t *testing.T) []string {
	dirs := []string{t.ArtifactDir()}
	if dir := os.Getenv("ACTIONBUS_ARTIFACTS"); dir != "" {
		require.NoError(t, os.MkdirAll(dir, 0o755))
		dirs = append([]string{dir}, dirs...)
	}
	return dirs
}

func chromium(t *testing.T) string {
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Skip("browser test skipped: no chromium on PATH (.ci/run installs Debian's chromium: apt-get install -y chromium)")
	return ""
}

// TestTheConsoleFollowsARunAndApprovesFromTheInbox drives the console in
// headless Chromium at 1 280 × 800: start a run from the form and watch
// its timeline reach completed live, start a mutation, approve it from the
// inbox (its Approve and Deny in the window, its hash shortened with a
// copy control) and see the run finish, verify its audit chain; a
// ten-step parallel workflow's waterfall shows ten overlapping bars in
// the order and with the executors of the run's events. No page scrolls
// sideways; each is saved as a screenshot (see artifacts).
func TestTheConsoleFollowsARunAndApprovesFromTheInbox(t *testing.T) {
	path := chromium(t)
	url, token, c, ten := serve(t)
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path), chromedp.NoSandbox, chromedp.DisableGPU, chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 800),
		chromedp.Flag("disable-quic", true), chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true), chromedp.Flag("disable-sync", true))
	// The browser starts with the test's context (a step's shorter one
	// would stop it). Chromium under load sometimes crashes as it starts
	// (crashpad, before any page): a start that failed is tried again, up
	// to three times; a crash after it started fails the test.
	var ctx context.Context
	for attempt := 1; ; attempt++ {
		actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
		defer cancelAlloc()
		tctx, cancelTab := chromedp.NewContext(actx)
		defer cancelTab()
		err := chromedp.Do(tctx)
		if err == nil {
			ctx = tctx
			break
		}
		require.Less(t, attempt, 3, "chromium did not start: %v", err)
		t.Logf("chromium did not start (attempt %d): %v", attempt, err)
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()

	poll := func(expr string) chromedp.Action[chromedp.Void] {
		return chromedp.Steps(chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
			for {
				_, err := chromedp.Poll[bool](expr)(ctx, tg)
				// A poll set up while a navigation replaced the document
				// names the old one's context: poll the new document.
				if err == nil || ctx.Err() != nil || !strings.Contains(err.Error(), "Cannot find context with specified id") {
					return err
				}
			}
		}))
	}
	css := func(sel string) chromedp.CSS { return chromedp.CSS(sel) }
	// shows waits until an element matches sel and is rendered (has a
	// box): the page re-renders its tables on every update, so a node
	// found once may be replaced, and it renders a view's tables while the
	// view is hidden (a click on a nav link shows it on the hashchange
	// event that follows).
	shows := func(sel string) chromedp.Action[chromedp.Void] {
		return poll(fmt.Sprintf(`(e => e !== null && e.getClientRects().length > 0)(document.querySelector(%q))`, sel))
	}
	// fill types a value into a form field (as the input event a user's
	// typing fires).
	fill := func(id, value string) chromedp.Action[chromedp.Void] {
		return chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
			_, err := chromedp.Evaluate[bool](fmt.Sprintf(`(() => { const e = document.getElementById(%q); e.value = %q;
				e.dispatchEvent(new Event("input", {bubbles: true})); return true; })()`, id, value))(ctx, tg)
			return err
		})
	}
	check := func(sel string) chromedp.Action[chromedp.Void] {
		return chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
			_, err := chromedp.Evaluate[bool](fmt.Sprintf(`(() => { const e = document.querySelector(%q); e.checked = true;
				e.dispatchEvent(new Event("change", {bubbles: true})); return e.checked; })()`, sel))(ctx, tg)
			return err
		})
	}
	hash := func() string {
		h, err := chromedp.Run(ctx, chromedp.Evaluate[string](`location.hash`))
		require.NoError(t, err)
		return h
	}

	// do runs steps one at a time; on failure it logs which, and what the
	// page showed.
	do := func(steps ...chromedp.Action[chromedp.Void]) error {
		for i, step := range steps {
			sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
			err := chromedp.Do(sctx, step)
			cancel()
			if err != nil {
				text, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`location.href + "\n" + document.body.innerText`))
				return fmt.Errorf("step %d: %w; the page showed:\n%s", i, err, text)
			}
		}
		return nil
	}

	// fits checks that the page shown fits a 1 280 px window: nothing
	// scrolls sideways and the header spans the page.
	fits := func(page string) {
		t.Helper()
		w, err := chromedp.Run(ctx, chromedp.Evaluate[[]float64](`[document.documentElement.scrollWidth, document.documentElement.clientWidth,
			window.innerWidth, document.querySelector("header").getBoundingClientRect().width]`))
		require.NoError(t, err)
		assert.Equal(t, 1280.0, w[2], "the window is 1 280 px wide")
		assert.LessOrEqual(t, w[0], w[1], "the %s page scrolls sideways (scrollWidth, clientWidth): %v", page, w[:2])
		assert.Equal(t, w[1], w[3], "the header spans the %s page", page)
	}
	// screenshot saves the page as name.png (see artifacts) and prints
	// where.
	dirs := artifacts(t)
	screenshot := func(name, what string) {
		t.Helper()
		shot, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
		require.NoError(t, err)
		for _, dir := range dirs {
			file := filepath.Join(dir, name+".png")
			require.NoError(t, os.WriteFile(file, shot, 0o600))
			t.Logf("screenshot of %s: %s", what, file)
		}
	}

	// A read: started from the form, its timeline live to completed.
	require.NoError(t, do(
		chromedp.EmulateViewport(1280, 800),
		chromedp.Navigate(url+"/#token="+token),
		poll(`document.getElementById("live").textContent === "live"`),
		chromedp.Click(css(`nav a[data-view="start"]`)),
		fill("start-action", "inv.stock"),
		fill("start-args", `{"sku": "A-1"}`),
		chromedp.Click(css(`#start-submit`)),
		poll(`location.hash.startsWith("#run/")`),
		shows(`#timeline tr[data-type="run.completed"]`),
		shows(`#run-status.completed`),
	))
	readRun := strings.TrimPrefix(hash(), "#run/")
	// One function writes every duration.
	durations, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`[human(0), human(850), human(12345), human(59999), human(163999), human(3723000), human(180000000)]`))
	require.NoError(t, err)
	assert.Equal(t, []string{"0 ms", "850 ms", "12.3 s", "1 m 0 s", "2 m 44 s", "1 h 2 m", "2 d 2 h"}, durations)
	// A run's LLM usage is written as the CLI writes it; a run that made
	// no LLM call (this one) shows none.
	usage, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`[usageText({calls: 2, inputTokens: 20000, outputTokens: 200, costUsd: 0.0416, estimatedCalls: 1}),
		document.getElementById("run-usage").textContent]`))
	require.NoError(t, err)
	assert.Equal(t, []string{"20200 tokens (20000 in, 200 out) in 2 call(s), $0.0416; 1 call(s) estimated", ""}, usage)

	steps, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`[...document.querySelectorAll("#timeline tr[data-type]")].map(r => r.dataset.type)`))
	require.NoError(t, err)
	assert.Contains(t, steps, "action.completed")
	offsets, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`[...document.querySelectorAll("#timeline tr[data-type] td:first-child")].map(td => td.textContent)`))
	require.NoError(t, err)
	for _, o := range offsets {
		assert.Regexp(t, `^\+(\d+ ms|\d+\.\d s|\d+ m \d+ s|\d+ h \d+ m)$`, o, "the timeline's offsets are durations")
	}

	// Its audit chain, verified from the run view (the records are
	// appended within the auditor's FlushAfter: asked until complete).
	require.NoError(t, do(
		poll(`(() => { const a = document.getElementById("run-audit");
			if (!a.textContent.includes("complete")) document.getElementById("run-verify").click();
			return a.className === "verified" && a.textContent.includes("complete"); })()`),
	))

	// A mutation waits for approval; approved from the inbox, it finishes.
	require.NoError(t, do(
		chromedp.Click(css(`nav a[data-view="start"]`)),
		fill("start-action", "inv.reorder"),
		// Input with markup: shown as text in the inbox, never run.
		fill("start-args", `{"sku": "B-2<img src=x onerror=\"window.injected=1\">"}`),
		check(`#start-modes input[value="mutate"]`),
		chromedp.Click(css(`#start-submit`)),
		poll(`location.hash.startsWith("#run/") && location.hash !== "#run/`+readRun+`"`),
		shows(`#run-status.awaiting_approval`),
	))
	mutation := strings.TrimPrefix(hash(), "#run/")
	require.NoError(t, do(
		chromedp.Click(css(`nav a[data-view="approvals"]`)),
		shows(`#approvals tr[data-approval^="`+mutation+`"] button.approve`),
	))
	approvalID, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.querySelector('#approvals tr[data-approval^="`+mutation+`"]').dataset.approval`))
	require.NoError(t, err)

	// The inbox fits the window: Approve and Deny are in it, the input
	// hash is shortened and its copy control holds the whole hash.
	fits("approvals")
	inView, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`[...document.querySelectorAll("#approvals button.approve, #approvals button.deny")].map(b => {
		const r = b.getBoundingClientRect();
		return (r.width > 0 && r.left >= 0 && r.top >= 0 && r.right <= window.innerWidth && r.bottom <= window.innerHeight ? "inside " : "outside ") +
			JSON.stringify([r.left, r.top, r.right, r.bottom, window.innerWidth, window.innerHeight]); })`))
	require.NoError(t, err)
	require.Len(t, inView, 2)
	for _, b := range inView {
		assert.True(t, strings.HasPrefix(b, "inside "), "Approve and Deny are inside the window: %v", inView)
	}
	hashCell, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`(() => { const td = document.querySelector('#approvals tr[data-approval="`+approvalID+`"] td:nth-child(5)');
		return [td.querySelector("code").textContent, td.querySelector("button.copy").dataset.copy]; })()`))
	require.NoError(t, err)
	pendingApproval, err := c.Approval(ctx, approvalID)
	require.NoError(t, err)
	assert.Len(t, pendingApproval.Context.InputHash, 64)
	assert.Equal(t, []string{pendingApproval.Context.InputHash[:12] + "…", pendingApproval.Context.InputHash}, hashCell)
	// Its copy control puts the whole hash on the clipboard.
	require.NoError(t, do(
		chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
			for _, name := range []string{"clipboard-write", "clipboard-read"} {
				if _, err := cdp.Call(ctx, tg, browser.SetPermission, browser.SetPermissionParams{
					Permission: &browser.PermissionDescriptor{Name: name}, Setting: browser.PermissionSettingGranted, Origin: url}); err != nil {
					return err
				}
			}
			return nil
		}),
		chromedp.Click(css(`#approvals tr[data-approval="`+approvalID+`"] td:nth-child(5) button.copy`)),
		poll(`document.getElementById("message").textContent === "copied `+pendingApproval.Context.InputHash+`"`),
	))
	copied, err := chromedp.Run(ctx, chromedp.Evaluate[string](`navigator.clipboard.readText()`, chromedp.EvalAwaitPromise))
	require.NoError(t, err)
	assert.Equal(t, pendingApproval.Context.InputHash, copied, "the clipboard holds the whole hash")
	screenshot("approvals", "the approvals inbox at 1 280 × 800, one pending reorder whose input carries markup (shown as text)")

	// A crafted link: the run id of #run/<id> names the approval's approve
	// endpoint with "\" (which a URL reads as "/"). Its Cancel button shows
	// an error and sends nothing; the approval stays pending.
	require.NoError(t, do(
		chromedp.Navigate("about:blank"),
		chromedp.Navigate(url+`/#run/..\approvals\`+approvalID+`\approve?`),
		poll(`document.getElementById("message").textContent.startsWith("invalid_run_id")`),
		poll(`(() => { document.getElementById("message").textContent = ""; return true; })()`),
		chromedp.Click(css(`#run-cancel`)),
		poll(`document.getElementById("message").textContent.startsWith("invalid_run_id")`),
		chromedp.Click(css(`nav a[data-view="approvals"]`)),
		shows(`#approvals tr[data-approval="`+approvalID+`"] button.approve`),
	))
	pending := apiGet(t, url, token, "/v1/runs/"+mutation)
	assert.Equal(t, "awaiting_approval", pending["status"], "the crafted link's Cancel answered the approval")

	inboxAction, err := chromedp.Run(ctx, chromedp.Text(css(`#approvals tbody tr td:nth-child(3)`)))
	require.NoError(t, err)
	assert.Equal(t, "inv.reorder", inboxAction)
	input, err := chromedp.Run(ctx, chromedp.Text(css(`#approvals tbody tr td:nth-child(6)`)))
	require.NoError(t, err)
	assert.Contains(t, input, `<img src=x`, "the input is shown as text")
	require.NoError(t, do(
		chromedp.Click(css(`#approvals button.approve`)),
		poll(`document.getElementById("message").textContent.startsWith("approved ")`),
		chromedp.Click(css(`nav a[data-view="runs"]`)),
		shows(`#runs tr[data-run="`+mutation+`"] td.status.completed`),
		shows(`#runs tr[data-run="`+readRun+`"] td.status.completed`),
	))
	fits("runs")
	screenshot("runs", "the runs list: the read and the approved reorder, completed")

	// The read's audit records, verified on the Audit page.
	require.NoError(t, do(
		chromedp.Click(css(`nav a[data-view="audit"]`)),
		poll(`!document.getElementById("view-audit").classList.contains("hidden")`),
		fill("audit-run", readRun),
		chromedp.Click(css(`#audit-verify`)),
		poll(`document.getElementById("audit-result").className === "verified"`),
		shows(`#audit tbody tr[data-kind]`),
	))
	fits("audit")
	screenshot("audit", "the Audit page: the read's records, its chain verified")

	// The finished mutation's timeline.
	require.NoError(t, do(
		chromedp.Click(css(`nav a[data-view="runs"]`)),
		chromedp.Click(css(`#runs tr[data-run="`+mutation+`"] a`)),
		shows(`#timeline tr[data-type="run.completed"]`),
		shows(`#timeline tr[data-type="approval.resolved"]`),
	))
	// A link carrying someone else's token never replaces the one this
	// tab is signed in with (its runs and approvals would be theirs).
	require.NoError(t, do(
		chromedp.Navigate("about:blank"),
		chromedp.Navigate(url+"/#runs&token=mallorys-token"),
		poll(`document.getElementById("message").textContent.startsWith("this link carries another token")`),
		poll(`sessionStorage.getItem("actionbus-token") === `+fmt.Sprintf("%q", token)),
		chromedp.Click(css(`#runs tr[data-run="`+mutation+`"] a`)),
		shows(`#timeline tr[data-type="run.completed"]`),
	))

	injected, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`window.injected === 1 || document.querySelector("img") !== null`))
	require.NoError(t, err)
	assert.False(t, injected, "markup in an approval's input ran in the console")

	// A run followed while it goes on: each transition's live steps
	// arrive as one run.progress message, and the timeline shows a row per
	// step, in order (the result's action-completed, then observe).
	require.NoError(t, do(
		chromedp.Navigate(url+"/#token="+token),
		poll(`document.getElementById("live").textContent === "live"`),
		chromedp.Click(css(`nav a[data-view="start"]`)),
		fill("start-action", "inv.reorder"),
		fill("start-args", `{"sku": "C-3"}`),
		check(`#start-modes input[value="mutate"]`),
		chromedp.Click(css(`#start-submit`)),
		poll(`location.hash.startsWith("#run/") && location.hash !== "#run/`+mutation+`" && location.hash !== "#run/`+readRun+`"`),
		shows(`#run-status.awaiting_approval`),
		shows(`#timeline tr[data-type="approval.requested"]`),
	))
	followed := strings.TrimPrefix(hash(), "#run/")
	var pendingID string
	require.Eventually(t, func() bool {
		for _, x := range apiGet(t, url, token, "/v1/approvals")["approvals"].([]any) {
			if ap := x.(map[string]any); ap["runId"] == followed {
				pendingID, _ = ap["approvalId"].(string)
			}
		}
		return pendingID != ""
	}, 20*time.Second, 20*time.Millisecond, "the followed run's approval is listed")
	req, err := http.NewRequest(http.MethodPost, url+"/v1/approvals/"+pendingID+"/approve", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+token)
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	res.Body.Close()
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.NoError(t, do(shows(`#timeline tr[data-type="run.completed"]`)))
	progress, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](
		`[...document.querySelectorAll('#timeline tr[data-type="run.progress"] td:nth-child(4)')].map(td => td.textContent.split(/[ :]/)[0])`))
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(progress), 2, "the timeline shows the live steps: %q", progress)
	assert.Equal(t, []string{"action-completed", "observe"}, progress[len(progress)-2:], "one row per step, in order: %q", progress)

	fits("run")
	screenshot("run", "the run view of a reorder approved while followed: its waterfall (the approval as a gap) and timeline")

	// tenBars checks the waterfall shown of a run of ten calls of
	// inv.count (the batch-th to run): ten bars, in the order and with
	// the executors of the run's results (read through the client),
	// each as long as its call took, overlapping in time.
	tenBars := func(runID string, batch int) {
		t.Helper()
		type bar struct {
			Action, Step, Executor, Outcome, Label string
			Cycle, PlanIndex                       int
			Start, End, Y                          float64
		}
		bars, err := chromedp.Run(ctx, chromedp.Evaluate[[]bar](`[...document.querySelectorAll("#waterfall g.bar")].map(g => ({
			action: g.dataset.action, step: g.dataset.step, executor: g.dataset.executor, outcome: g.dataset.outcome,
			label: g.querySelector("text.bar-label").textContent, cycle: +g.dataset.cycle, planIndex: +g.dataset.planIndex,
			start: +g.dataset.start, end: +g.dataset.end, y: +g.querySelector("rect").getAttribute("y") }))`))
		require.NoError(t, err)
		var results []events.ActionCompleted
		fctx, fcancel := context.WithTimeout(ctx, 30*time.Second)
		ended, err := c.Follow(fctx, runID, func(e client.Event) {
			var d events.ActionCompleted
			if e.Type == events.TypeActionCompleted && json.Unmarshal(e.Data, &d) == nil {
				results = append(results, d)
			}
		})
		fcancel()
		require.NoError(t, err)
		require.Equal(t, client.StatusCompleted, ended.Status)
		require.Len(t, results, fanOut)
		require.Len(t, bars, fanOut)
		slices.SortStableFunc(results, func(a, b events.ActionCompleted) int {
			if a.Cycle != b.Cycle {
				return a.Cycle - b.Cycle
			}
			return a.PlanIndex - b.PlanIndex
		})
		executors := map[string]bool{}
		for i, r := range results {
			b := bars[i]
			assert.Equal(t, r.Action, b.Action, "bar %d", i)
			assert.Equal(t, r.Cycle, b.Cycle, "bar %d", i)
			assert.Equal(t, r.PlanIndex, b.PlanIndex, "bar %d", i)
			assert.Equal(t, r.StepID, b.Step, "bar %d", i)
			assert.Equal(t, r.Executor, b.Executor, "bar %d", i)
			assert.NotEmpty(t, b.Executor, "bar %d", i)
			assert.Contains(t, b.Label, "on "+r.Executor, "bar %d is labelled with its executor", i)
			assert.Equal(t, "ok", b.Outcome, "bar %d", i)
			assert.InDelta(t, float64(r.DurationMs), b.End-b.Start, 1, "bar %d is as long as the call took", i)
			if i > 0 {
				assert.Greater(t, b.Y, bars[i-1].Y, "bar %d is drawn below bar %d", i, i-1)
			}
			executors[r.Executor] = true
		}
		t.Logf("the ten calls ran on %d executor(s)", len(executors))
		// The ten calls ran at once, and the waterfall shows it: its bars
		// overlap, each with another, and together they span less time than
		// their lengths add up to (calls one after the other would not). A
		// bar ends when its result was published, so under load a bar may
		// be drawn a little later than its call ran; never all one after
		// the other.
		require.GreaterOrEqual(t, ten.met(), batch, "the ten calls of inv.count were in flight at once")
		var total float64
		first, last := bars[0].Start, bars[0].End
		for i, b := range bars {
			total += b.End - b.Start
			first, last = min(first, b.Start), max(last, b.End)
			overlaps := false
			for j, o := range bars {
				overlaps = overlaps || (i != j && b.Start < o.End && o.Start < b.End)
			}
			assert.True(t, overlaps, "bar %d overlaps another: %+v", i, bars)
		}
		assert.Less(t, last-first, total, "the bars span less time than they add up to: %+v", bars)
	}

	// A workflow of ten independent steps runs them at once (each call
	// of inv.count waits for the other nine): its waterfall shows ten
	// bars, one per step, in the order and with the executors of the
	// run's results, overlapping in time.
	wf := client.NewWorkflow("count-ten")
	for i := range fanOut {
		wf.Step(fmt.Sprintf("count-%d", i), "inv.count", map[string]any{"sku": fmt.Sprintf("W-%d", i)})
	}
	started := apiPost(t, url, token, "/v1/runs", map[string]any{"workflow": wf.Build()})
	wfRun, _ := started["runId"].(string)
	require.NotEmpty(t, wfRun, "%v", started)
	require.NoError(t, do(
		chromedp.Navigate(url+"/#run/"+wfRun),
		shows(`#timeline tr[data-type="run.completed"]`),
		poll(fmt.Sprintf(`document.querySelectorAll("#waterfall g.bar").length === %d`, fanOut)),
	))
	tenBars(wfRun, 1)
	fits("run")
	screenshot("waterfall", "the waterfall of a ten-step parallel workflow: ten overlapping bars, each labelled with its executor")

	// gaps and outcomes read the waterfall's waits and its bars'
	// outcomes, top to bottom.
	type drawn struct{ Gaps, Outcomes []string }
	waterfall := func() drawn {
		t.Helper()
		d, err := chromedp.Run(ctx, chromedp.Evaluate[drawn](`({
			gaps: [...document.querySelectorAll("#waterfall g.gap")].map(g => g.dataset.reason),
			outcomes: [...document.querySelectorAll("#waterfall g.bar")].map(g => g.dataset.outcome + "/" + g.dataset.attempt) })`))
		require.NoError(t, err)
		return d
	}

	// A step that fails and is retried: a failed bar, the retry's
	// backoff as a gap, then the bar of the attempt that succeeded.
	started = apiPost(t, url, token, "/v1/runs", map[string]any{"workflow": client.NewWorkflow("flaky").
		Step("flaky", "inv.flaky", map[string]any{"sku": "F-1"}, client.Retry(2, 100, false)).Build()})
	flakyRun, _ := started["runId"].(string)
	require.NotEmpty(t, flakyRun, "%v", started)
	require.NoError(t, do(
		chromedp.Navigate(url+"/#run/"+flakyRun),
		shows(`#timeline tr[data-type="run.completed"]`),
		poll(`document.querySelectorAll("#waterfall g.bar").length === 2`),
	))
	got := waterfall()
	assert.Equal(t, []string{"failed/1", "ok/2"}, got.Outcomes)
	require.Len(t, got.Gaps, 1)
	assert.True(t, strings.HasPrefix(got.Gaps[0], "retry backoff"), "%q", got.Gaps)
	fits("run")
	screenshot("waterfall-retry", "the waterfall of a step retried: its failed attempt, the retry's backoff as a gap, the attempt that succeeded")

	// A mutation denied in the inbox: its wait for approval as a gap
	// that ends denied, and a denied bar.
	started = apiPost(t, url, token, "/v1/runs", map[string]any{"action": map[string]any{"name": "inv.reorder", "args": map[string]any{"sku": "D-4"}},
		"allowedModes": []string{"read", "mutate"}})
	deniedRun, _ := started["runId"].(string)
	require.NotEmpty(t, deniedRun, "%v", started)
	require.NoError(t, do(
		chromedp.Navigate(url+"/#approvals"),
		shows(`#approvals tr[data-approval^="`+deniedRun+`"] button.deny`),
		chromedp.Evaluate[chromedp.Void](`window.prompt = () => "not today"`),
		chromedp.Click(css(`#approvals tr[data-approval^="`+deniedRun+`"] button.deny`)),
		poll(`document.getElementById("message").textContent.startsWith("denied ")`),
		chromedp.Navigate(url+"/#run/"+deniedRun),
		shows(`#timeline tr[data-type="run.failed"]`),
		poll(`document.querySelectorAll("#waterfall g.bar").length === 1`),
	))
	got = waterfall()
	assert.Equal(t, []string{"denied/0"}, got.Outcomes)
	require.Len(t, got.Gaps, 1)
	assert.Regexp(t, `^awaiting approval .* → denied$`, got.Gaps[0])
	fits("run")

	// An agent run that asks a question, then plans ten calls: the wait
	// for the answer is a gap on a row of its own, the plan's cycle is
	// labelled as a plan of ten, with ten bars that match its results
	// and overlap (checked as the workflow's are).
	started = apiPost(t, url, token, "/v1/runs", map[string]any{"prompt": "count the stock", "scenario": "plan10"})
	planRun, _ := started["runId"].(string)
	require.NotEmpty(t, planRun, "%v", started)
	require.NoError(t, do(
		chromedp.Navigate(url+"/#run/"+planRun),
		shows(`#run-status.awaiting_input`),
		poll(`[...document.querySelectorAll("#waterfall g.gap")].some(g => g.dataset.reason.startsWith("awaiting input"))`),
	))
	apiPost(t, url, token, "/v1/runs/"+planRun+"/input", map[string]any{"answer": "north"})
	require.NoError(t, do(
		shows(`#timeline tr[data-type="run.completed"]`),
		poll(fmt.Sprintf(`document.querySelectorAll("#waterfall g.bar").length === %d`, fanOut)),
	))
	got = waterfall()
	assert.Equal(t, slices.Repeat([]string{"ok/1"}, fanOut), got.Outcomes)
	assert.Equal(t, []string{"awaiting input: Which warehouse? → answered"}, got.Gaps)
	groups, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`[...document.querySelectorAll("#waterfall text.group")].map(g => g.textContent)`))
	require.NoError(t, err)
	assert.Equal(t, []string{"cycle 1", "cycle 2 — plan of 10, in parallel"}, groups)
	tenBars(planRun, 2)
	fits("run")
	screenshot("waterfall-plan", "the waterfall of an agent run: its clarify question answered (a gap), then a plan of ten calls")

	// The catalog and the start form fit too.
	require.NoError(t, do(
		chromedp.Click(css(`nav a[data-view="catalog"]`)),
		shows(`#catalog tr[data-action="inv.count"]`),
	))
	fits("catalog")
	require.NoError(t, do(chromedp.Click(css(`nav a[data-view="start"]`)), poll(`!document.getElementById("view-start").classList.contains("hidden")`)))
	fits("start")
	require.NoError(t, do(chromedp.Navigate(url+"/#run/"+deniedRun), poll(`document.querySelectorAll("#waterfall g.bar").length === 1`)))
	screenshot("waterfall-denied", "the waterfall of a reorder denied in the inbox: the wait for approval as a gap, then a denied mark")

	// A call that runs (one inv.count waits for nine others that never
	// come) is a running bar that grows while followed; canceled from
	// the run view, it ends cancelled. The page sees a call dispatched
	// only while it follows the run (the dispatch is a live step): the
	// call follows a retried step, whose backoff leaves it the time to.
	// (Last: it leaves inv.count's batch one call short.)
	started = apiPost(t, url, token, "/v1/runs", map[string]any{"workflow": client.NewWorkflow("slow").
		Step("first", "inv.flaky", map[string]any{"sku": "R-1"}, client.Retry(2, 100, false)).
		Step("count", "inv.count", map[string]any{"sku": client.FromStep("first", "/sku")}).Build()})
	runningRun, _ := started["runId"].(string)
	require.NotEmpty(t, runningRun, "%v", started)
	require.NoError(t, do(
		chromedp.Navigate(url+"/#run/"+runningRun),
		poll(`(() => { const g = document.querySelector('#waterfall g.bar[data-outcome="running"]');
			if (!g) return false;
			if (window.runningEnd === undefined) window.runningEnd = +g.dataset.end;
			return +g.dataset.end > window.runningEnd; })()`),
	))
	screenshot("waterfall-running", "the waterfall of a call still running: a blue bar growing")
	require.NoError(t, do(
		chromedp.Click(css(`#run-cancel`)),
		shows(`#timeline tr[data-type="run.canceled"]`),
		poll(`[...document.querySelectorAll("#waterfall g.bar")].map(g => g.dataset.outcome).join() === "failed,ok,cancelled"`),
	))
}
