"""Store: a large export staged on disk as Arrow part files and analysed a time segment at a time."""
