"""The DLProf database: schema, writer, reader, merge of ranks."""
