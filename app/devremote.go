package main

import (
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"

	"github.com/promoflow/promoflow/app/api"
)

// errDevNotLoopback: dev listens where other machines reach it, and was not
// told to (--allow-remote).
var errDevNotLoopback = errors.New("dev listens on an address that is not loopback")

// errDevDemoTokens: dev is reachable from other machines, where its demo
// tokens, printed in its banner and known to anyone who read the docs, would
// open the APIs.
var errDevDemoTokens = errors.New("dev reachable from other machines needs tokens of its own")

// checkDevExposure refuses a dev that listens beyond this machine unless
// allowRemote, and then one with no tokens of its own or with a demo token:
// dev makes the demo tokens up when none is set. apiTokens and adminToken
// are the operator's, before dev fills them in.
func checkDevExposure(allowRemote bool, apiTokens, adminToken string, addrs map[string]string) error {
	var remote []string
	for what, addr := range addrs {
		if !isLoopback(addr) {
			remote = append(remote, fmt.Sprintf("%s on %s", what, addr))
		}
	}
	if len(remote) == 0 {
		return nil
	}
	slices.Sort(remote)
	where := strings.Join(remote, ", ")
	if !allowRemote {
		return fmt.Errorf("%w (%s): listen on 127.0.0.1, or give --allow-remote ($DEV_ALLOW_REMOTE=true) with $PROMOTION_API_TOKENS and $CATALOG_ADMIN_TOKEN", errDevNotLoopback, where)
	}
	tokens, _ := api.ParseTokens(apiTokens, 0) // validated with the promotion's settings
	demoAPIToken := tokens.Has(devAPIToken)
	switch {
	case len(tokens) == 0 || demoAPIToken:
		return fmt.Errorf("%w (%s): set $PROMOTION_API_TOKENS to tokens other than %q", errDevDemoTokens, where, devAPIToken)
	case adminToken == "" || adminToken == devAdminToken:
		return fmt.Errorf("%w (%s): set $CATALOG_ADMIN_TOKEN to a token other than %q", errDevDemoTokens, where, devAdminToken)
	}
	return nil
}

// isLoopback says whether a listen address is reached from this machine
// only: "localhost" or a loopback IP. No host (":8080") is every interface,
// and another name may resolve anywhere.
func isLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
