package session

// CABundlePath is where a boundary (srt's sandbox, a microsandbox guest)
// with secrets finds its trust store: the system's certificates and the
// session CA's, which its proxy intercepts bound hosts with (see CAEnv).
const CABundlePath = "/run/agentconnect/ca-bundle.pem"

// CAEnv points the usual tools' trust variables at CABundlePath.
func CAEnv() []string {
	var env []string
	for _, k := range []string{"SSL_CERT_FILE", "NODE_EXTRA_CA_CERTS", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "GIT_SSL_CAINFO", "CARGO_HTTP_CAINFO"} {
		env = append(env, k+"="+CABundlePath)
	}
	return env
}
