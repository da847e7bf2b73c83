package main

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/promoflow/promoflow/app/api"
)

// secretSetting is a secret given in its variable (NAME) or in a file named
// by NAME_FILE, as a mounted Kubernetes or Docker secret is: the value then
// stays out of the process's environment, which /proc and crash reports show.
type secretSetting struct {
	env   string
	value *string
	file  string
}

// secretWithFile binds a secret's flag and variable onto p, and its file form
// (--name-file, NAME_FILE); resolve reads the file.
func (s *settings) secretWithFile(p *string, name, env, usage string) *secretSetting {
	sec := &secretSetting{env: env, value: p}
	s.str(p, name, env, "", usage)
	s.str(&sec.file, name+"-file", env+"_FILE", "", "file that holds "+env+" (a mounted secret), its trailing newline dropped; not with "+env)
	return sec
}

// errSecretTwice is a secret set both in its variable and as a file.
var errSecretTwice = errors.New("set either the variable or its _FILE form, not both")

// resolve reads the file form into the value, when given.
func (sec *secretSetting) resolve() error {
	if sec == nil || sec.file == "" {
		return nil
	}
	if *sec.value != "" {
		return fmt.Errorf("%s and %s_FILE: %w", sec.env, sec.env, errSecretTwice)
	}
	raw, err := os.ReadFile(sec.file)
	if err != nil {
		return fmt.Errorf("%s_FILE: %w", sec.env, err)
	}
	*sec.value = strings.TrimSuffix(strings.TrimSuffix(string(raw), "\n"), "\r")
	return nil
}

// resolveSecrets reads every secret's file form.
func resolveSecrets(secrets ...*secretSetting) error {
	var errs []error
	for _, sec := range secrets {
		errs = append(errs, sec.resolve())
	}
	return errors.Join(errs...)
}

// validateTokenLength refuses a token shorter than api.MinTokenLength,
// naming its variable; dev's demo tokens are exempt.
func validateTokenLength(dev bool, env, token string) error {
	if dev || token == "" || len(token) >= api.MinTokenLength {
		return nil
	}
	return fmt.Errorf("%s: %w", env, api.ErrShortToken)
}

// tokenMinLength is the shortest token a process takes: none in dev.
func tokenMinLength(dev bool) int {
	if dev {
		return 0
	}
	return api.MinTokenLength
}
