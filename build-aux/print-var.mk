# print-var.mk: "make -f Makefile -f print-var.mk print-var VAR=X" prints $(X) of an upstream Makefile.
print-var: ; $(info $($(VAR)))@:
