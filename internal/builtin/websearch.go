package builtin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/actionbus/actionbus"
)

// WebSearchArgs is the input of web_search.
type WebSearchArgs struct {
	Query string `json:"query,omitempty" jsonschema:"description=What to search for."`
	Limit int    `json:"limit,omitempty" jsonschema:"minimum=1,maximum=20"`
}

// SearchHit is one result of web_search.
type SearchHit struct {
	Title   string `json:"title"`
	URL     string `json:"url"`
	Snippet string `json:"snippet,omitempty"`
}

// WebSearchResult is the output of web_search.
type WebSearchResult struct {
	Kind    string      `json:"kind"`
	Query   string      `json:"query"`
	Results []SearchHit `json:"results"`
}

// Searcher queries a SearxNG-style JSON endpoint
// (GET {endpoint}?q=...&format=json → {"results":[{"title","url","content"}]}).
type Searcher struct {
	endpoint string
	client   *http.Client
}

// NewSearcher returns a searcher for endpoint whose connections go
// through guard.
func NewSearcher(endpoint string, guard NetGuard) (*Searcher, error) {
	u, err := url.Parse(endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("builtin: search endpoint %q is not an http(s) URL", endpoint)
	}
	return &Searcher{endpoint: endpoint, client: guard.Client(2)}, nil
}

// Search runs one query. A missing query is taken from the run's prompt
// by the caller; an endpoint failure is a typed error.
func (s *Searcher) Search(ctx context.Context, in WebSearchArgs) (WebSearchResult, error) {
	q := strings.TrimSpace(in.Query)
	if q == "" {
		return WebSearchResult{}, actionbus.Errorf(actionbus.CodeActionArgsInvalid, "web_search needs a query").WithDetail("key", "query")
	}
	limit := in.Limit
	if limit <= 0 {
		limit = 5
	}
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	u, _ := url.Parse(s.endpoint)
	v := u.Query()
	v.Set("q", q)
	v.Set("format", "json")
	u.RawQuery = v.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return WebSearchResult{}, err
	}
	req.Header.Set("Accept", "application/json")
	resp, err := s.client.Do(req)
	if err != nil {
		if errors.Is(err, ErrAddressRefused) {
			return WebSearchResult{}, actionbus.Errorf(actionbus.CodePolicyRejected, "search endpoint refused: %v", unwrapURLError(err))
		}
		if ctx.Err() != nil {
			return WebSearchResult{}, actionbus.Errorf(actionbus.CodeTimeout, "the search endpoint did not answer in time")
		}
		return WebSearchResult{}, actionbus.Errorf(actionbus.CodeHandlerFailed, "search failed: %v", unwrapURLError(err))
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 2<<20))
	if err != nil {
		return WebSearchResult{}, actionbus.Errorf(actionbus.CodeHandlerFailed, "search failed: %v", err)
	}
	if resp.StatusCode != http.StatusOK {
		return WebSearchResult{}, actionbus.Errorf(actionbus.CodeHandlerFailed, "the search endpoint answered HTTP %d", resp.StatusCode).WithDetail("status", resp.StatusCode)
	}
	var doc struct {
		Results []struct {
			Title   string `json:"title"`
			URL     string `json:"url"`
			Content string `json:"content"`
		} `json:"results"`
	}
	if err := json.Unmarshal(body, &doc); err != nil {
		return WebSearchResult{}, actionbus.Errorf(actionbus.CodeHandlerFailed, "the search endpoint's answer is not the expected JSON: %v", err)
	}
	out := WebSearchResult{Kind: "web_search_result", Query: q, Results: []SearchHit{}}
	for _, r := range doc.Results {
		if len(out.Results) == limit {
			break
		}
		if r.URL == "" {
			continue
		}
		out.Results = append(out.Results, SearchHit{Title: r.Title, URL: r.URL, Snippet: r.Content})
	}
	return out, nil
}
