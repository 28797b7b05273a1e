# sed script: radianced.service -> radianced@.service, the template unit of
# one daemon per GPU. The instance is the device ordinal: radianced@1
# serves GPU 1 on /run/radiance/radiance-1.sock (radianced@1.socket) with
# the configuration SYSCONFDIR/radiance/radianced-1.conf (start from a copy
# of radianced.conf; its device and socket keys are overridden here). The
# GPU is required: without it the instance fails, naming the reason, instead
# of serving from the CPU; a drop-in with Environment=RADIANCED_REQUIRE_GPU=no
# lets it fall back (e.g. to try the units on a machine without a GPU).
1i\
# Generated from radianced.service by systemd/instance-service.sed: one\
# radianced per GPU, the instance is its device ordinal. docs/daemon.md,\
# Operations, explains the choices.
s|^Description=.*|Description=radiance W4A8 inference daemon on GPU %i|
s|radianced\.socket|radianced@%i.socket|g
s|radianced\.conf|radianced-%i.conf|g
s|/run/radiance/radiance\.sock|/run/radiance/radiance-%i.sock|g
s|^ExecStart=\(.*\)$|Environment=RADIANCED_REQUIRE_GPU=yes\nExecStart=\1 --device %i --require-gpu=${RADIANCED_REQUIRE_GPU}|
/^# backend = auto (the default)/,/^# radianced@N\.service, which requires its GPU\.$/c\
# An instance requires its GPU (--require-gpu=yes below): when this build has\
# no GPU backend or GPU %i does not answer, radianced exits 1 naming the\
# reason (Restart= retries) instead of serving from the CPU. A drop-in with\
# Environment=RADIANCED_REQUIRE_GPU=no allows the CPU fall-back (a warning).
