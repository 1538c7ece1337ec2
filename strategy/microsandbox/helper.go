package microsandbox

import (
	"context"
	"io"
	"log"

	"github.com/agentconnect-md/agentconnect/api/helper"
	"github.com/agentconnect-md/agentconnect/strategy/microsandbox/vmimage"
)

// ProbeMain is `probe`: Check, for the daemon.
func ProbeMain(stdin io.Reader, stdout io.Writer) error {
	return helper.Serve(stdin, stdout, func(req helper.ProbeRequest) helper.ProbeResponse {
		return helper.ProbeResponse{Reason: Check(req.VM, req.ImageDir)}
	})
}

// ImageMain is `image`: the default image, or a custom one prepared (pulled
// or read, turned into a root filesystem, cached by digest), for the daemon.
// Progress goes to stderr, which the daemon logs.
func ImageMain(stdin io.Reader, stdout, stderr io.Writer) error {
	logf := log.New(stderr, "", 0).Printf
	return helper.Serve(stdin, stdout, func(req helper.ImageRequest) helper.ImageResponse {
		img, err := vmimage.Default(req.ImageDir)
		if err == nil && req.Ref != "" {
			store := &vmimage.Store{Dir: req.ImagesDir, Base: img, Logf: logf}
			img, err = store.Prepare(context.Background(), req.Ref)
		}
		if err != nil {
			return helper.ImageResponse{Error: err.Error()}
		}
		return helper.ImageResponse{Kernel: img.Kernel, Initrd: img.Initrd, Rootfs: img.Rootfs, Digest: img.Digest}
	})
}
