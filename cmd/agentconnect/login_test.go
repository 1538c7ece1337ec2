package main

import (
	"strings"
	"testing"
)

// TestLoginSplit: each runtime's tokens leave its credentials file for
// secrets, and the rest of the file stays as written (Codex's id_token and
// an expiry in milliseconds among it).
func TestLoginSplit(t *testing.T) {
	codex := `{"OPENAI_API_KEY":null,"tokens":{"id_token":"eyJ.id.tok","access_token":"real-a","refresh_token":"real-r","account_id":"acc"},"last_refresh":"2026-12-01T00:00:00Z"}`
	tmpl, secrets, err := loginProfiles["codex"].split("box", "codex", []byte(codex))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"access_token": "{{box-codex-access}}"`, `"refresh_token": "{{box-codex-refresh}}"`, `"id_token": "eyJ.id.tok"`, `"account_id": "acc"`} {
		if !strings.Contains(tmpl, want) {
			t.Errorf("template lacks %s:\n%s", want, tmpl)
		}
	}
	if strings.Contains(tmpl, "real-") || len(secrets) != 2 || secrets[0].Value != "real-a" || secrets[0].TokenField != "access_token" ||
		secrets[0].Headers[0] != "authorization" || secrets[1].Value != "real-r" || len(secrets[1].Hosts) != 0 || secrets[1].TokenHosts[0] != "auth.openai.com" {
		t.Errorf("template %s\nsecrets %+v", tmpl, secrets)
	}
	claude := `{"claudeAiOauth":{"accessToken":"real-a","refreshToken":"real-r","expiresAt":1764000000123}}`
	tmpl, _, err = loginProfiles["claude"].split("c", "claude", []byte(claude))
	if err != nil || !strings.Contains(tmpl, `"expiresAt": 1764000000123`) {
		t.Errorf("claude: %v\n%s", err, tmpl)
	}
	for _, bad := range []string{`[]`, `{"claudeAiOauth":{}}`, `not json real-a`} {
		if _, _, err := loginProfiles["claude"].split("c", "claude", []byte(bad)); err == nil || strings.Contains(err.Error(), "real-a") {
			t.Errorf("split(%s): %v", bad, err)
		}
	}
	if guessRuntime([]string{"node", "/opt/acp/node_modules/@zed-industries/claude-agent-acp/dist/index.js"}) != "claude" || guessRuntime([]string{"codex-acp"}) != "codex" || guessRuntime([]string{"bash"}) != "" {
		t.Error("guessRuntime")
	}
}
