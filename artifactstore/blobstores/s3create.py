"""Objects created once on S3 (the identity, removal records), and servers that do not
honour the condition (issue 49).

A create is a PutObject with `If-None-Match: *`: AWS S3, moto and Ceph's RADOS Gateway
(measured on 16.2, also with eight writers racing on one key) refuse it on a key that
exists (412 PreconditionFailed; AWS answers 409 ConditionalRequestConflict during a
concurrent one). Another server may refuse the header (501 NotImplemented, 400
InvalidArgument), or ignore it and overwrite: then two first writers could each create
"the" identity, silently. So until a store knows what its server does, a create looks
first (one GET) and writes nothing where an object is; its first create that succeeds is
confirmed by sending the same conditional put again, which must be refused. A server that
refuses the header or ignores it is named once, in one warning line, and from then on this
store creates by look-then-write, a create counting as its own only when the bytes read
back are the ones it wrote. A race of two first writers is then possible; the index's one
store id per namespace settles it, and a writer whose identity lost refuses to write
(saying so). A 412 tells too that the server honours the condition; and a 412 may answer
a retry whose first attempt's answer was lost (a read timeout under load): its object is
then this writer's own bytes (a random id, a signed record), so the bytes decide.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from typing import Any

from artifactstore.blobstores.s3errors import error_code

log = logging.getLogger("artifactstore")

# Answers meaning "the key exists" (or another create of it is in flight).
CREATED_ELSEWHERE = {"PreconditionFailed", "412", "ConditionalRequestConflict"}
# Answers meaning "this server does not do conditional writes".
NOT_SUPPORTED = {"NotImplemented", "InvalidArgument"}
Put = Callable[..., Any]  # put(**condition): the PutObject of the bytes, with the condition
Read = Callable[[], bytes | None]  # the bytes at the key now (None: no object)


class CreateOnce:
    """What one store's S3 server does with `If-None-Match: *`, learned on its first
    create: `honoured` is None until then."""

    def __init__(self, endpoint: Callable[[], str]) -> None:
        self.endpoint = endpoint
        self.honoured: bool | None = None
        self._lock = threading.Lock()

    def create(self, put: Put, read: Read, data: bytes) -> bool:
        """Put `data` where no object is; True if this call created it, False (writing
        nothing, on a server that honours the condition) if one was there. Backend
        errors propagate (the store turns them into its one line)."""
        if self.honoured is None and read() is not None:  # never trust an unknown server
            return False
        if self.honoured is not False:
            try:
                put(IfNoneMatch="*")
            except Exception as exc:
                code = error_code(exc)
                if code in CREATED_ELSEWHERE:
                    self.honoured = True
                    return self._own(read, data)
                if code not in NOT_SUPPORTED:
                    raise
                self._degrade(f"answered {code} to it")
            else:
                if self.honoured or self._confirmed(put):
                    return True
                self._degrade("ignored it: a second create of the same key succeeded")
                return read() == data
        return self._look_then_write(put, read, data)

    def _confirmed(self, put: Put) -> bool:
        """The same conditional put again: refused where the server honours it."""
        try:
            put(IfNoneMatch="*")
        except Exception as exc:
            if error_code(exc) not in CREATED_ELSEWHERE:
                raise
            self.honoured = True
            return True
        return False

    @staticmethod
    def _own(read: Read, data: bytes) -> bool:
        """Whether the object there holds `data` (unread: another's, as the server said)."""
        with contextlib.suppress(Exception):
            return read() == data
        return False

    def _look_then_write(self, put: Put, read: Read, data: bytes) -> bool:
        if read() is not None:
            return False
        put()
        return read() == data  # another first writer's, written after ours: not ours

    def _degrade(self, what: str) -> None:
        with self._lock:
            said, self.honoured = self.honoured is False, False
        if not said:
            log.warning(
                "artifactstore: S3 at %s does not honour If-None-Match: * (it %s): objects "
                "created once (the store's identity, removal records) are created by "
                "look-then-write and read back; two first writers racing are settled by the "
                "index (docs/operations.md, 'S3 servers')",
                self.endpoint(),
                what,
            )
