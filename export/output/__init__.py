"""Output: writing OUT without losing what is there. The journaled publish (local and into object
storage), the output lock, Energon's metadata, fsync'd writes, size estimates for the disk-space check,
and the OS errors' user-facing messages. The export job (export/job/) drives them; they know nothing of
windows or configs."""
