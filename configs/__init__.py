"""Flagfiles of the paper's settings and a smoke run (`--flagfile=configs/NAME.flags`);
a package so that an installed dare-tf ships them (`dare_tf._programs.configs`)."""
