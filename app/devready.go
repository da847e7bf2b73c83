package main

import (
	"context"
	"net"
	"net/http"
	"os"
	"time"

	"golang.org/x/term"
)

// waitReady polls each process's /readyz until every one answers 200, or ctx ends.
func waitReady(ctx context.Context, urls ...string) error {
	client := &http.Client{Timeout: 2 * time.Second}
	for _, u := range urls {
		for {
			if ready(ctx, client, u+"/readyz") {
				break
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	return nil
}

func ready(ctx context.Context, client *http.Client, url string) bool {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return false
	}
	resp, err := client.Do(req)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// localURL is the URL of a listen address on this machine: a listener on
// every interface (":8080") is reached at 127.0.0.1.
func localURL(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "http://" + addr
	}
	if host == "" || host == "0.0.0.0" || host == "::" {
		host = "127.0.0.1"
	}
	return "http://" + net.JoinHostPort(host, port)
}

// stderrWidth is the columns of the terminal on stderr (0 when unknown).
func stderrWidth() int {
	w, _, err := term.GetSize(int(os.Stderr.Fd()))
	if err != nil {
		return 0
	}
	return w
}
