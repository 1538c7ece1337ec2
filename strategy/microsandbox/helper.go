package microsandbox

import (
	"io"

	"github.com/agentconnect-md/agentconnect/api/helper"
)

// ProbeMain is `probe`: Check, for the daemon.
func ProbeMain(stdin io.Reader, stdout io.Writer) error {
	return helper.Serve(stdin, stdout, func(req helper.ProbeRequest) helper.ProbeResponse {
		return helper.ProbeResponse{Reason: Check(req.VM, req.ImageDir)}
	})
}
