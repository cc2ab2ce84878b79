// Package console is actionbus's web console: one page over the HTTP API
// (internal/httpapi) — runs with filters, a run's waterfall (its action
// calls as bars on a time axis, drawn in plain SVG) and live timeline,
// the approvals inbox, audit records with their chain verified and the
// catalog (docs/http.md, "The console"). The page is a Go html/template
// with a little plain JavaScript and no build step; it
// holds no data itself: the browser reads everything from the API with the
// caller's bearer token, so the API's authentication and the NATS trust
// rules behind it apply to the console as to any caller.
package console

import (
	"embed"
	"html/template"
	"net/http"
)

//go:embed page.html static
var files embed.FS

var page = template.Must(template.ParseFS(files, "page.html"))

// Options configures the console's page.
type Options struct {
	// Tenant is shown in the header.
	Tenant string
	// Title is the page's title; default "actionbus console".
	Title string
}

// Handler serves the console page at / and its script and favicon at
// /static/.
// Mount it beside the API's handler (which serves /v1/).
func Handler(o Options) http.Handler {
	if o.Title == "" {
		o.Title = "actionbus console"
	}
	mux := http.NewServeMux()
	mux.Handle("GET /static/", http.FileServerFS(files))
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		// The page runs only its own script and talks only to its origin.
		w.Header().Set("Content-Security-Policy", "default-src 'self'; style-src 'self' 'unsafe-inline'; frame-ancestors 'none'")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.Header().Set("Referrer-Policy", "no-referrer")
		_ = page.Execute(w, o)
	})
	return mux
}

// Mount returns one handler serving the console at / and api (the
// httpapi handler) under /v1/.
func Mount(api http.Handler, o Options) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/v1/", api)
	mux.Handle("/", Handler(o))
	return mux
}
