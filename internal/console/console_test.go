package console_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/executor"
	"github.com/actionbus/actionbus/internal/console"
	"github.com/actionbus/actionbus/internal/httpapi"
)

var approvalKey = []byte("0123456789abcdef0123456789abcdef")

type skuIn struct {
	SKU string `json:"sku"`
}

func register(ex *executor.Executor) error {
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

// serve starts a stack and the console with its API over it, connected as
// the deployed client and approver users, and returns the console's URL
// and a token holding every role.
func serve(t *testing.T) (string, string) {
	t.Helper()
	srv := actionbustest.NewServer(t, actionbustest.Options{Users: true})
	srv.StartStack(t, actionbustest.StackOptions{Register: register, ApprovalKeys: "k1:" + base64.StdEncoding.EncodeToString(approvalKey) + ":*"})
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
	return hs.URL, token
}

func TestThePageHoldsNoDataAndForbidsForeignScripts(t *testing.T) {
	url, _ := serve(t)
	res, err := http.Get(url + "/")
	require.NoError(t, err)
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	assert.Equal(t, http.StatusOK, res.StatusCode)
	assert.Contains(t, res.Header.Get("Content-Security-Policy"), "default-src 'self'")
	assert.Contains(t, string(body), `<b id="tenant">default</b>`)
	assert.Contains(t, string(body), `/static/console.js`)
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
// headless Chromium: start a run from the form and watch its timeline
// reach completed live, start a mutation, approve it from the inbox and
// see the run finish, verify its audit chain.
func TestTheConsoleFollowsARunAndApprovesFromTheInbox(t *testing.T) {
	path := chromium(t)
	url, token := serve(t)
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path), chromedp.NoSandbox, chromedp.DisableGPU, chromedp.UserDataDir(t.TempDir()),
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
	// shows waits until an element matches sel: the page re-renders its
	// tables on every update, so a node found once may be replaced.
	shows := func(sel string) chromedp.Action[chromedp.Void] {
		return poll(fmt.Sprintf(`document.querySelector(%q) !== null`, sel))
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

	// A read: started from the form, its timeline live to completed.
	require.NoError(t, do(
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
	steps, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`[...document.querySelectorAll("#timeline tr[data-type]")].map(r => r.dataset.type)`))
	require.NoError(t, err)
	assert.Contains(t, steps, "action.completed")

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

	// The finished mutation's timeline, for the screenshot.
	require.NoError(t, do(
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

	shot, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	require.NoError(t, err)
	file := filepath.Join(t.TempDir(), "console.png")
	require.NoError(t, os.WriteFile(file, shot, 0o600))
	t.Logf("screenshot of the console: %s", file)
	if dir := os.Getenv("ACTIONBUS_SCREENSHOT_DIR"); dir != "" { // kept beyond the test's temp dir
		require.NoError(t, os.WriteFile(filepath.Join(dir, "console.png"), shot, 0o600))
	}
}
