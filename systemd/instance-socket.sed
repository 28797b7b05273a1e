# sed script: radianced.socket -> radianced@.socket, the socket of the
# per-GPU instance radianced@N.service (see instance-service.sed).
1i\
# Generated from radianced.socket by systemd/instance-socket.sed.
s|^Description=.*|Description=radiance daemon socket of GPU %i|
s|^ListenStream=/run/radiance/radiance\.sock$|ListenStream=/run/radiance/radiance-%i.sock|
